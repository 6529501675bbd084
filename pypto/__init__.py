"""pypto-rt's stand-in for the `pypto` package: `pypto.language` and friends, run on the CPU.

It cannot share an environment with the real PyPTO compiler, which owns the same name.
"""
__pypto_rt_shim__ = True
