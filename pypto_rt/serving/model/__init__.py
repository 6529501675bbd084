"""A small MoE decoder built only from pypto-rt kernels (issue 15), and its single-process torch golden."""
