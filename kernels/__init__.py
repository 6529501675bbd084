"""DSL kernels shipped with pypto-rt (MoE, paged attention); installed as pypto_rt.kernels."""
