"""pypto-launch: starts ranks and reports failures; installed as pypto_rt.launch."""
