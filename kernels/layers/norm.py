"""RMSNorm, optionally fused with the residual add before it (vLLM's fused_add_rms_norm):

    out = x * rsqrt(mean(x^2) + eps) * weight              in FP32, rounded once to x's dtype
    with residual:  residual <- x + residual (rounded to the dtype, in place); out = rms_norm(residual)
"""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import PL_DTYPES, ROW_TILE, cast_to, check, check_float, describe

T_DYN = pl.dynamic("T_DYN")


def rms_normalizer(hidden: int, eps: float):
    """An inline `(rows [R, H] FP32, weight [1, H] FP32) -> the RMS-normalised rows times weight, FP32`."""
    inv_hidden = 1.0 / hidden

    @pl.jit.inline
    def normalize(rows, weight):
        inv_rms = pl.rsqrt(pl.adds(pl.muls(pl.row_sum(pl.mul(rows, rows)), inv_hidden), eps))
        return pl.col_expand_mul(pl.row_expand_mul(rows, inv_rms), weight)

    return normalize


@functools.lru_cache(maxsize=None)
def rms_norm_kernel(hidden: int, dtype: torch.dtype, eps: float):
    dt = PL_DTYPES[dtype]
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, eps)

    @pl.jit
    def rms_norm(
        x: pl.Tensor[[T_DYN, hidden], dt],
        weight: pl.Tensor[[1, hidden], dt],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        x.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="rms_norm"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            out[t0 : t0 + valid, :] = narrow(normalize(widen(x[t0 : t0 + valid, :]), widen(weight)))
        return out

    return rms_norm


@functools.lru_cache(maxsize=None)
def add_rms_norm_kernel(hidden: int, dtype: torch.dtype, eps: float):
    dt = PL_DTYPES[dtype]
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, eps)

    @pl.jit
    def add_rms_norm(
        x: pl.Tensor[[T_DYN, hidden], dt],
        residual: pl.InOut[pl.Tensor[[T_DYN, hidden], dt]],
        weight: pl.Tensor[[1, hidden], dt],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        x.bind_dynamic(0, T_DYN)
        residual.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="add_rms_norm"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            summed = narrow(pl.add(widen(x[t0 : t0 + valid, :]), widen(residual[t0 : t0 + valid, :])))
            residual[t0 : t0 + valid, :] = summed
            out[t0 : t0 + valid, :] = narrow(normalize(widen(summed), widen(weight)))
        return out

    return add_rms_norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [T, H] with weight [H] (x's dtype) -> [T, H]. With `residual` ([T, H], contiguous, x's dtype)
    it first sets residual to x + residual in place and normalises that."""
    check_float("rms_norm", "x", x, 2)
    hidden, dtype = x.shape[1], x.dtype
    check(isinstance(weight, torch.Tensor) and list(weight.shape) == [hidden] and weight.dtype == dtype,
          "rms_norm", lambda: f"weight must be {dtype} [{hidden}] (x's dtype and hidden size), got {describe(weight)}")
    if residual is not None:
        check(isinstance(residual, torch.Tensor) and residual.shape == x.shape and residual.dtype == dtype
              and residual.is_contiguous(), "rms_norm",
              lambda: f"residual must be a contiguous {dtype} {list(x.shape)} (x's shape), got {describe(residual)}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.shape[0]:
        w = weight.contiguous().view(1, hidden)
        if residual is None:
            rms_norm_kernel(hidden, dtype, float(eps))(x.contiguous(), w, out)
        else:
            add_rms_norm_kernel(hidden, dtype, float(eps))(x.contiguous(), residual, w, out)
    return out
