"""pypto-rt: runs PyPTO (pl DSL) kernels on the CPU."""
