"""MoE expert parallelism as a library (issue 14): `MoEConfig`, the gate kernel
(`pypto_rt.kernels.moe.gate.gate`), and `MoEBuffer` (dispatch and combine across ranks)."""
from pypto_rt.kernels.moe.buffer import DispatchHandle, DispatchResult, MoEBuffer
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, MoEConfigError, MoEError

__all__ = ["MoEConfig", "MoEBuffer", "DispatchResult", "DispatchHandle", "MoEError", "MoEConfigError",
           "MoEArgumentError"]
