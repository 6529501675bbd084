"""MoE expert parallelism as a library (issue 14): `MoEConfig`, the gate kernel
(`pypto_rt.kernels.moe.gate.gate`), `MoEBuffer` (dispatch and combine across ranks), `MoELayer` (a whole layer per call), the routed and
shared experts, the router GEMM and Hugging Face weight loading."""
from pypto_rt.kernels.moe.buffer import DispatchHandle, DispatchResult, MoEBuffer
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.experts import run_experts, shared_expert
from pypto_rt.kernels.moe.layer import MoELayer
from pypto_rt.kernels.moe.loading import load_moe_weights
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, MoEConfigError, MoEError
from pypto_rt.kernels.moe.router import router_logits
from pypto_rt.kernels.moe.weights import ExpertWeights, MoEWeights, QuantizedExpertWeights, RouterWeights

__all__ = ["MoEConfig", "MoEBuffer", "MoELayer", "DispatchResult", "DispatchHandle", "MoEError", "MoEConfigError",
           "MoEArgumentError", "run_experts", "shared_expert", "router_logits", "load_moe_weights", "ExpertWeights",
           "QuantizedExpertWeights", "RouterWeights", "MoEWeights"]
