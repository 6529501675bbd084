"""MoE expert parallelism as a library (issue 14). Built so far: `MoEConfig` and the gate kernel
(`pypto_rt.kernels.moe.gate.gate`); dispatch, combine, experts and `MoELayer` come later."""
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, MoEConfigError, MoEError

__all__ = ["MoEConfig", "MoEError", "MoEConfigError", "MoEArgumentError"]
