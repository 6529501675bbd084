"""A linear layer without bias (projections, the LM head): out [T, N] = x [T, K] @ weight [N, K].T, accumulated in
FP32 and rounded once to the output dtype (x's, or FP32 for logits).

Blocks: ROW_TILE token rows times a column block of N (its largest divisor up to COL_TILE_MAX), the token blocks
outermost; K is walked in steps (matmul, then matmul_acc)."""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import (COL_TILE_MAX, K_TILE_MAX, PL_DTYPES, ROW_TILE, cast_to, check,
                                            check_float, describe, divisor_tile)

T_DYN = pl.dynamic("T_DYN")


@functools.lru_cache(maxsize=None)
def linear_kernel(n_out: int, k_in: int, dtype: torch.dtype, out_dtype: torch.dtype):
    dt, odt = PL_DTYPES[dtype], PL_DTYPES[out_dtype]
    n_step, k_step = divisor_tile(n_out, COL_TILE_MAX), divisor_tile(k_in, K_TILE_MAX)
    narrow = cast_to(pl.FP32, odt)

    @pl.jit
    def linear(
        x: pl.Tensor[[T_DYN, k_in], dt],
        weight: pl.Tensor[[n_out, k_in], dt],
        out: pl.Out[pl.Tensor[[T_DYN, n_out], odt]],
    ):
        x.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for blk in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE * (n_out // n_step), name_hint="linear"):
            t0 = blk // (n_out // n_step) * ROW_TILE
            n0 = blk % (n_out // n_step) * n_step
            valid = pl.min(ROW_TILE, t_dim - t0)
            rows = x[t0 : t0 + valid, :]
            acc = pl.matmul(rows[:, 0:k_step], weight[n0 : n0 + n_step, 0:k_step], b_trans=True, out_dtype=pl.FP32)
            for k0 in pl.pipeline(k_step, k_in, k_step, stage=2):
                acc = pl.matmul_acc(acc, rows[:, k0 : k0 + k_step], weight[n0 : n0 + n_step, k0 : k0 + k_step],
                                    b_trans=True)
            out[t0 : t0 + valid, n0 : n0 + n_step] = narrow(acc)
        return out

    return linear


def linear(x: torch.Tensor, weight: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [T, K] @ weight [N, K].T -> [T, N] in out_dtype (default x's dtype); weight in x's dtype."""
    check_float("linear", "x", x, 2)
    check_float("linear", "weight", weight, 2)
    check(weight.shape[1] == x.shape[1] and weight.dtype == x.dtype, "linear",
          lambda: f"weight must be {x.dtype} [N, {x.shape[1]}] (x's dtype and width), got {describe(weight)}")
    out_dtype = out_dtype or x.dtype
    check(out_dtype in PL_DTYPES, "linear",
          lambda: f"out_dtype={out_dtype} is not one of {', '.join(map(str, PL_DTYPES))}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=out_dtype)
    if x.shape[0]:
        linear_kernel(weight.shape[0], x.shape[1], x.dtype, out_dtype)(x.contiguous(), weight.contiguous(), out)
    return out
