"""The router GEMM: logits [T, E] = x [T, H] @ gate_weight [E, H].T in FP32, as a `@pl.jit` kernel per shape.

One block per ROW_TILE token rows (the last one partial), H walked in K steps. Operands of one dtype multiply as
they are (FP32 accumulation); of two dtypes (bf16 activations, an FP32 gate as DeepSeek-V3 keeps it) both are
taken to FP32 first, so the result is the FP32 GEMM of the values given. The gate kernel takes the logits.
"""
import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe.ffn import PL_DTYPES, ROW_TILE, cast_to, k_tile, projection
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, describe

T_DYN = pl.dynamic("T_DYN")


@dataclass(frozen=True)
class RouterShape:
    experts: int
    hidden: int
    x_dtype: torch.dtype
    w_dtype: torch.dtype
    k_step: int


@functools.lru_cache(maxsize=None)
def router_kernel(shape: RouterShape):
    experts, hidden = shape.experts, shape.hidden
    xdt, wdt = PL_DTYPES[shape.x_dtype], PL_DTYPES[shape.w_dtype]
    same = xdt == wdt
    project = projection(hidden, shape.k_step, pl.FP32,
                         None if same else cast_to(xdt, pl.FP32), None if same else cast_to(wdt, pl.FP32))

    @pl.jit
    def moe_router(
        x: pl.Tensor[[T_DYN, hidden], xdt],
        gate_weight: pl.Tensor[[experts, hidden], wdt],
        logits: pl.Out[pl.Tensor[[T_DYN, experts], pl.FP32]],
    ):
        x.bind_dynamic(0, T_DYN)
        logits.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="moe_router"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            x_tile = pl.fillpad(pl.set_validshape(x[t0 : t0 + ROW_TILE, :], valid, hidden))
            logits[t0 : t0 + ROW_TILE, :] = pl.set_validshape(project(x_tile, gate_weight), valid, experts)
        return logits

    return moe_router


def router_logits(gate_weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Router logits [T, E] float32 of tokens x [T, H] under gate_weight [E, H] (bf16, fp16 or fp32 each).
    T may be 0 (no kernel runs)."""
    bad = MoEArgumentError.at_caller
    if not isinstance(gate_weight, torch.Tensor) or gate_weight.dim() != 2 or gate_weight.dtype not in PL_DTYPES:
        raise bad(f"router_logits: gate_weight must be a 2-D [num_experts, hidden] tensor of "
                  f"{', '.join(map(str, PL_DTYPES))}, got {describe(gate_weight)}")
    experts, hidden = gate_weight.shape
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != hidden or x.dtype not in PL_DTYPES:
        raise bad(f"router_logits: x must be a [T, {hidden}] tensor (gate_weight's hidden size) of "
                  f"{', '.join(map(str, PL_DTYPES))}, got {describe(x)}")
    logits = torch.zeros(x.shape[0], experts, dtype=torch.float32)
    if x.shape[0]:
        shape = RouterShape(experts, hidden, x.dtype, gate_weight.dtype, k_tile(hidden, ffn_module.K_TILE_MAX))
        kernel = router_kernel(shape)
        kernel(x.contiguous(), gate_weight.contiguous(), logits)
    return logits

