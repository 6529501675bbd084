"""The attention block's output and the next norm in one kernel: the O projection, the residual add and RMSNorm.

    normed = out_proj_add_norm(attn [T, QH * D], w_o [H, QH * D], residual [T, H], norm_weight [H], eps)
    # hidden = attn @ w_o.T (FP32 accumulation, rounded to the dtype); residual <- hidden + residual in place;
    # normed = rms_norm(residual): what linear -> rms_norm(..., residual=) give, in one call
"""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import (PL_DTYPES, ROW_TILE, cast_to, check, check_float, describe,
                                            matmul_bt_walked)
from pypto_rt.kernels.layers.norm import rms_normalizer

T_DYN = pl.dynamic("T_DYN")


def out_proj_add_normer(hidden: int, k_in: int, dt, eps: float):
    """An inline `(rows [R, k_in], w_o, residual rows [R, H], weight [1, H]) -> (summed, normed)`, both [R, H] in
    dt: summed = rows @ w_o.T rounded, + residual (the new residual); normed = its RMSNorm (kernels that fuse
    what follows, e.g. the MoE route, call it too)."""
    matmul_bt = matmul_bt_walked(k_in)
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, eps)

    @pl.jit.inline
    def add_norm(rows, w_o, residual_rows, weight):
        summed = narrow(pl.add(widen(narrow(matmul_bt(rows, w_o))), widen(residual_rows)))
        return summed, narrow(normalize(widen(summed), widen(weight)))

    return add_norm


@functools.lru_cache(maxsize=None)
def out_proj_norm_kernel(hidden: int, k_in: int, dtype: torch.dtype, eps: float):
    dt = PL_DTYPES[dtype]
    add_norm = out_proj_add_normer(hidden, k_in, dt, eps)

    @pl.jit
    def out_proj_add_norm(
        attn: pl.Tensor[[T_DYN, k_in], dt],
        w_o: pl.Tensor[[hidden, k_in], dt],
        residual: pl.InOut[pl.Tensor[[T_DYN, hidden], dt]],
        weight: pl.Tensor[[1, hidden], dt],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        attn.bind_dynamic(0, T_DYN)
        residual.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(attn, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="out_proj_add_norm"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            summed, normed = add_norm(attn[t0 : t0 + valid, :], w_o, residual[t0 : t0 + valid, :], weight)
            residual[t0 : t0 + valid, :] = summed
            out[t0 : t0 + valid, :] = normed
        return out, residual

    return out_proj_add_norm


def check_out_proj(name: str, attn: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor,
                   norm_weight: torch.Tensor) -> tuple[int, int, int]:
    """(tokens, k_in, hidden) of an out_proj_add_norm call, every argument checked (an error naming it)."""
    check_float(name, "attn", attn, 2)
    (tokens, k_in), dtype = attn.shape, attn.dtype
    check(isinstance(w_o, torch.Tensor) and w_o.dim() == 2 and w_o.shape[1] == k_in and w_o.dtype == dtype,
          name, lambda: f"w_o must be {dtype} [H, {k_in}] (attn's dtype and width), got {describe(w_o)}")
    hidden = w_o.shape[0]
    check(isinstance(residual, torch.Tensor) and list(residual.shape) == [tokens, hidden] and
          residual.dtype == dtype and residual.is_contiguous(), name,
          lambda: f"residual must be a contiguous {dtype} [{tokens}, {hidden}], got {describe(residual)}")
    check(isinstance(norm_weight, torch.Tensor) and list(norm_weight.shape) == [hidden] and
          norm_weight.dtype == dtype, name, lambda: f"norm_weight must be {dtype} [{hidden}], got "
          f"{describe(norm_weight)}")
    return tokens, k_in, hidden


def out_proj_add_norm(attn: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                      eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of residual <- attn @ w_o.T + residual (in place) -> [T, H] in attn's dtype."""
    tokens, k_in, hidden = check_out_proj("out_proj_add_norm", attn, w_o, residual, norm_weight)
    out = torch.empty(tokens, hidden, dtype=attn.dtype)
    if tokens:
        out_proj_norm_kernel(hidden, k_in, attn.dtype, float(eps))(attn.contiguous(), w_o.contiguous(), residual,
                                                                   norm_weight.view(1, hidden), out)
    return out
