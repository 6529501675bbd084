"""Rotary position embedding, neox style (rotate_half: a head's first and second halves form the pairs), with
each token's position taken from a tensor:

    cos_sin = rope_cache(head_dim, max_positions, theta)       # [P, D] FP32: cos of the D/2 frequencies | sin
    out = rotary_embedding(x, positions, cos_sin)              # x [T, heads * D] -> [T, heads * D]
    out[:, h, :D/2] = x1 * cos - x2 * sin,  out[:, h, D/2:] = x2 * cos + x1 * sin   (FP32, rounded once)
"""
import functools
import math

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import PL_DTYPES, ROW_TILE, cast_to, check, check_float, describe

T_DYN = pl.dynamic("T_DYN")


def rope_cache(head_dim: int, max_positions: int, theta: float = 10000.0) -> torch.Tensor:
    """[max_positions, head_dim] FP32: row p holds cos(p * f_i) for the head_dim / 2 frequencies
    f_i = theta ** (-2i / head_dim), then sin(p * f_i) (built once per model, as vLLM's RotaryEmbedding does)."""
    check(head_dim % 2 == 0 and head_dim > 0, "rope_cache",
          lambda: f"head_dim={head_dim} must be a positive even number")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_positions, dtype=torch.float64).view(-1, 1) * inv_freq.view(1, -1)
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


def rotate(heads: int, head_dim: int):
    """The inline `(rows [R, heads * D] FP32, angles [R, D] FP32: each row's cos | sin) -> the rows rotated, FP32`
    (the cos|sin row broadcast over the row's heads: [R, 1, D/2] against [R, heads, D/2])."""
    half, width = head_dim // 2, heads * head_dim

    @pl.jit.inline
    def rotated_rows(rows, angles, valid):
        cos = pl.reshape(angles[:, 0:half], [valid, 1, half])
        sin = pl.reshape(angles[:, half:head_dim], [valid, 1, half])
        per_head = pl.reshape(rows, [valid, heads, head_dim])
        x1 = per_head[:, :, 0:half]
        x2 = per_head[:, :, half:head_dim]
        rotated = pl.concat(pl.sub(pl.mul(x1, cos), pl.mul(x2, sin)), pl.add(pl.mul(x2, cos), pl.mul(x1, sin)))
        return pl.reshape(rotated, [valid, width])

    return rotated_rows


@functools.lru_cache(maxsize=None)
def rope_kernel(heads: int, head_dim: int, positions: int, dtype: torch.dtype):
    dt = PL_DTYPES[dtype]
    width = heads * head_dim
    widen, narrow, rotated_rows = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rotate(heads, head_dim)

    @pl.jit
    def rotary_embedding(
        x: pl.Tensor[[T_DYN, width], dt],
        pos: pl.Tensor[[T_DYN, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, head_dim], pl.FP32],
        out: pl.Out[pl.Tensor[[T_DYN, width], dt]],
    ):
        x.bind_dynamic(0, T_DYN)
        pos.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="rotary_embedding"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            angles = pl.mgather(cos_sin, pos[t0 : t0 + valid, :], coalesce="row")
            out[t0 : t0 + valid, :] = narrow(rotated_rows(widen(x[t0 : t0 + valid, :]), angles, valid))
        return out

    return rotary_embedding


def rotary_embedding(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads * D] (or [T, heads, D]) rotated at positions [T] (int64, each < cos_sin's rows) -> x's shape."""
    check_float("rotary_embedding", "x", x, x.dim() if isinstance(x, torch.Tensor) and x.dim() in (2, 3) else 2)
    check(isinstance(cos_sin, torch.Tensor) and cos_sin.dim() == 2 and cos_sin.dtype == torch.float32 and
          cos_sin.shape[1] % 2 == 0, "rotary_embedding",
          lambda: f"cos_sin must be the FP32 [positions, head_dim] of rope_cache, got {describe(cos_sin)}")
    tokens, head_dim = x.shape[0], cos_sin.shape[1]
    width = math.prod(x.shape[1:])
    check(width % head_dim == 0, "rotary_embedding",
          lambda: f"x's rows hold {width} values, not a whole number of heads of head_dim={head_dim} (cos_sin's width)")
    check(isinstance(positions, torch.Tensor) and list(positions.shape) == [tokens] and
          positions.dtype in (torch.int64, torch.int32), "rotary_embedding",
          lambda: f"positions must be an int64 [{tokens}] tensor (one per row of x), got {describe(positions)}")
    flat = x.reshape(tokens, width).contiguous()
    out = torch.empty_like(flat)
    if tokens:
        rope_kernel(width // head_dim, head_dim, cos_sin.shape[0], x.dtype)(
            flat, positions.to(torch.int64).contiguous().view(-1, 1), cos_sin.contiguous(), out)
    return out.view(x.shape)
