"""The attention block's input in one kernel per layer: [the residual add, or the embedding lookup] -> RMSNorm ->
the QKV GEMM -> neox RoPE of the q and k heads. Each stage rounds to the dtype where its own kernel does (the norm's
output, the GEMM's output, the rotation), so the results equal rms_norm -> linear -> rotary_embedding's.

    q, k, v = norm_qkv_rope(x, residual, norm_weight, w_qkv, positions, cos_sin, heads, eps)
        # residual <- x + residual in place (vLLM's fused add), then the norm of it
    q, k, v, hidden = embed_norm_qkv_rope(ids, table, norm_weight, w_qkv, positions, cos_sin, heads, eps)
        # the first layer: hidden = table[ids] (the residual stream), normalised from there

q [T, QH * D], k and v [T, KVH * D], contiguous; w_qkv [(QH + 2 KVH) * D, H] stacks q, k and v rows. Blocks of
ROW_TILE token rows (a decode step is one); T = 0 runs nothing.
"""
import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import (PL_DTYPES, ROW_TILE, cast_to, check, check_float, describe,
                                            matmul_bt_walked)
from pypto_rt.kernels.layers.norm import rms_normalizer
from pypto_rt.kernels.layers.rope import rotate

T_DYN = pl.dynamic("T_DYN")


@dataclass(frozen=True)
class QkvShape:
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    positions: int             # rows of the cos|sin table
    dtype: torch.dtype
    eps: float

    @property
    def q_width(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def _project_rotate(shape: QkvShape):
    """The inline `(normed [R, H] dtype, w_qkv, angles [R, D] FP32, valid) -> (q, k, v)` in the dtype: the GEMM
    (K walked in steps, FP32 accumulation, one rounding), then q and k heads rotated together."""
    dt, hidden = PL_DTYPES[shape.dtype], shape.hidden
    qk, width = shape.q_width + shape.kv_width, shape.q_width + 2 * shape.kv_width
    matmul_bt = matmul_bt_walked(hidden)
    widen, narrow = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt)
    rotated_rows = rotate(shape.q_heads + shape.kv_heads, shape.head_dim)
    q_width = shape.q_width

    @pl.jit.inline
    def project_rotate(normed, w_qkv, angles, valid):
        qkv = narrow(matmul_bt(normed, w_qkv))
        rotated = narrow(rotated_rows(widen(qkv[:, 0:qk]), angles, valid))
        return rotated[:, 0:q_width], rotated[:, q_width:qk], qkv[:, qk:width]

    return project_rotate


@functools.lru_cache(maxsize=None)
def norm_qkv_rope_kernel(shape: QkvShape):
    dt, hidden, d = PL_DTYPES[shape.dtype], shape.hidden, shape.head_dim
    width, qw, kw, positions = shape.q_width + 2 * shape.kv_width, shape.q_width, shape.kv_width, shape.positions
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, shape.eps)
    project_rotate = _project_rotate(shape)

    @pl.jit
    def norm_qkv_rope(
        x: pl.Tensor[[T_DYN, hidden], dt],
        residual: pl.InOut[pl.Tensor[[T_DYN, hidden], dt]],
        weight: pl.Tensor[[1, hidden], dt],
        w_qkv: pl.Tensor[[width, hidden], dt],
        pos: pl.Tensor[[T_DYN, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, d], pl.FP32],
        q: pl.Out[pl.Tensor[[T_DYN, qw], dt]],
        k: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        v: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
    ):
        for t in (x, residual, pos, q, k, v):
            t.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="norm_qkv_rope"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            summed = narrow(pl.add(widen(x[t0 : t0 + valid, :]), widen(residual[t0 : t0 + valid, :])))
            residual[t0 : t0 + valid, :] = summed
            normed = narrow(normalize(widen(summed), widen(weight)))
            angles = pl.mgather(cos_sin, pos[t0 : t0 + valid, :], coalesce="row")
            q_rows, k_rows, v_rows = project_rotate(normed, w_qkv, angles, valid)
            q[t0 : t0 + valid, :] = q_rows
            k[t0 : t0 + valid, :] = k_rows
            v[t0 : t0 + valid, :] = v_rows
        return q, k, v, residual

    return norm_qkv_rope


@functools.lru_cache(maxsize=None)
def embed_qkv_rope_kernel(shape: QkvShape, vocab: int):
    dt, hidden, d = PL_DTYPES[shape.dtype], shape.hidden, shape.head_dim
    width, qw, kw, positions = shape.q_width + 2 * shape.kv_width, shape.q_width, shape.kv_width, shape.positions
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, shape.eps)
    project_rotate = _project_rotate(shape)

    @pl.jit
    def embed_qkv_rope(
        ids: pl.Tensor[[T_DYN, 1], pl.INT64],
        table: pl.Tensor[[vocab, hidden], dt],
        weight: pl.Tensor[[1, hidden], dt],
        w_qkv: pl.Tensor[[width, hidden], dt],
        pos: pl.Tensor[[T_DYN, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, d], pl.FP32],
        q: pl.Out[pl.Tensor[[T_DYN, qw], dt]],
        k: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        v: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        hidden_rows: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        for t in (ids, pos, q, k, v, hidden_rows):
            t.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(ids, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="embed_qkv_rope"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            rows = pl.mgather(table, ids[t0 : t0 + valid, :], coalesce="row")
            hidden_rows[t0 : t0 + valid, :] = rows
            normed = narrow(normalize(widen(rows), widen(weight)))
            angles = pl.mgather(cos_sin, pos[t0 : t0 + valid, :], coalesce="row")
            q_rows, k_rows, v_rows = project_rotate(normed, w_qkv, angles, valid)
            q[t0 : t0 + valid, :] = q_rows
            k[t0 : t0 + valid, :] = k_rows
            v[t0 : t0 + valid, :] = v_rows
        return q, k, v, hidden_rows

    return embed_qkv_rope


def _shape(name: str, hidden: int, dtype, norm_weight, w_qkv, positions, tokens: int, cos_sin, heads, eps):
    """The QkvShape of a call, every argument checked (an error naming it otherwise)."""
    check(isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(h, int) and h > 0 for h in heads), name,
          lambda: f"heads must be (num_q_heads, num_kv_heads), got {heads!r}")
    check(isinstance(cos_sin, torch.Tensor) and cos_sin.dim() == 2 and cos_sin.dtype == torch.float32 and
          cos_sin.shape[1] % 2 == 0, name, lambda: f"cos_sin must be the FP32 [positions, head_dim] of rope_cache, got "
          f"{describe(cos_sin)}")
    d = cos_sin.shape[1]
    width = (heads[0] + 2 * heads[1]) * d
    check(isinstance(norm_weight, torch.Tensor) and list(norm_weight.shape) == [hidden] and norm_weight.dtype == dtype,
          name, lambda: f"norm_weight must be {dtype} [{hidden}], got {describe(norm_weight)}")
    check(isinstance(w_qkv, torch.Tensor) and list(w_qkv.shape) == [width, hidden] and w_qkv.dtype == dtype, name,
          lambda: f"w_qkv must be {dtype} [(QH + 2 KVH) * D, H] = [{width}, {hidden}], got {describe(w_qkv)}")
    check(isinstance(positions, torch.Tensor) and list(positions.shape) == [tokens] and
          positions.dtype in (torch.int64, torch.int32), name,
          lambda: f"positions must be an int64 [{tokens}] tensor (one per token), got {describe(positions)}")
    return QkvShape(hidden, heads[0], heads[1], d, cos_sin.shape[0], dtype, float(eps))


def _outputs(shape: QkvShape, tokens: int):
    return tuple(torch.empty(tokens, w, dtype=shape.dtype) for w in (shape.q_width, shape.kv_width, shape.kv_width))


def norm_qkv_rope(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor,
                  positions: torch.Tensor, cos_sin: torch.Tensor, heads: tuple[int, int], eps: float = 1e-6):
    """(q, k, v) of x [T, H]: residual <- x + residual in place, its RMSNorm, the QKV GEMM, RoPE of q and k at
    `positions` [T]. heads = (num_q_heads, num_kv_heads); head_dim is cos_sin's width."""
    check_float("norm_qkv_rope", "x", x, 2)
    tokens, hidden = x.shape
    shape = _shape("norm_qkv_rope", hidden, x.dtype, norm_weight, w_qkv, positions, tokens, cos_sin, heads, eps)
    check(isinstance(residual, torch.Tensor) and residual.shape == x.shape and residual.dtype == x.dtype and
          residual.is_contiguous(), "norm_qkv_rope",
          lambda: f"residual must be a contiguous {x.dtype} {list(x.shape)} (x's shape), got {describe(residual)}")
    q, k, v = _outputs(shape, tokens)
    if tokens:
        norm_qkv_rope_kernel(shape)(x.contiguous(), residual, norm_weight.view(1, hidden), w_qkv.contiguous(),
                                    positions.to(torch.int64).view(-1, 1), cos_sin.contiguous(), q, k, v)
    return q, k, v


def embed_norm_qkv_rope(ids: torch.Tensor, table: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor,
                        positions: torch.Tensor, cos_sin: torch.Tensor, heads: tuple[int, int], eps: float = 1e-6):
    """(q, k, v, hidden) of token ids [T]: hidden = table[ids] [T, H], then as norm_qkv_rope(hidden, ...)."""
    check_float("embed_norm_qkv_rope", "table", table, 2)
    check(isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.dtype in (torch.int64, torch.int32),
          "embed_norm_qkv_rope", lambda: f"ids must be a 1-D int64 tensor of token ids, got {describe(ids)}")
    tokens, (vocab, hidden) = ids.shape[0], table.shape
    shape = _shape("embed_norm_qkv_rope", hidden, table.dtype, norm_weight, w_qkv, positions, tokens, cos_sin, heads,
                   eps)
    q, k, v = _outputs(shape, tokens)
    rows = torch.empty(tokens, hidden, dtype=table.dtype)
    if tokens:
        embed_qkv_rope_kernel(shape, vocab)(ids.to(torch.int64).view(-1, 1), table.contiguous(),
                                            norm_weight.view(1, hidden), w_qkv.contiguous(),
                                            positions.to(torch.int64).view(-1, 1), cos_sin.contiguous(), q, k, v, rows)
    return q, k, v, rows
