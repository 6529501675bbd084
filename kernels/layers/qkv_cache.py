"""The attention block's input and the cache write in one kernel per layer: attention_input's kernels ([the residual
add, or the embedding lookup] -> RMSNorm -> the QKV GEMM -> neox RoPE), then the rotated k rows and the v rows
written into the layer's paged caches at slot_mapping (cache_write's row scatter). One kernel call where a decode
step made two (a call's entry and host checks cost as much as the scatter's torch calls).

    q, k, v = norm_qkv_rope_cache(x, residual, norm_weight, w_qkv, positions, cos_sin, heads, eps,
                                  key_cache, value_cache, slot_mapping, padded=False)
    q, k, v, hidden = embed_norm_qkv_rope_cache(ids, table, ..., key_cache, value_cache, slot_mapping, padded)

The results equal norm_qkv_rope's / embed_norm_qkv_rope's followed by write_kv_cache(k, v, ...) bit for bit (the
same tiles, the same scatter). The caller knows its slots on the host: every slot must be inside the pool
(< num_blocks * block_size) or -1 (padding), at least one of them live, and `padded` says whether any is -1 (a
scatter that skips -1 rows costs more calls). Unlike write_kv_cache, these do not read the slots to check them:
the caller does (MoEDecoder reads its slot mapping on the host once per step).
"""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.attention.attn_errors import check_caches, check_int
from pypto_rt.kernels.layers.attention_input import T_DYN, QkvShape, _outputs, _project_rotate, _shape
from pypto_rt.kernels.layers.common import PL_DTYPES, ROW_TILE, cast_to, check, check_float, describe
from pypto_rt.kernels.layers.norm import rms_normalizer

NB_DYN = pl.dynamic("NB_DYN")


def cache_writer(padded: bool):
    """The inline `(k, v [T, KVH * D], slots [1, T] INT64, k_flat, v_flat [slots, KVH * D]) -> (k_flat, v_flat)`:
    row t of k / v into row slots[t] of the flat caches; a slot of -1 writes nothing where `padded` (else every
    slot is live)."""
    oob = "skip" if padded else "clamp"

    @pl.jit.inline
    def write_cache(k, v, slots, k_flat, v_flat):
        k_flat = pl.mscatter(k, slots, k_flat, coalesce="row", scatter_oob=oob, scatter_conflict="default",
                             some_kept=padded)
        v_flat = pl.mscatter(v, slots, v_flat, coalesce="row", scatter_oob=oob, scatter_conflict="default",
                             some_kept=padded)
        return k_flat, v_flat

    return write_cache


@functools.lru_cache(maxsize=None)
def norm_qkv_rope_cache_kernel(shape: QkvShape, block_size: int, padded: bool):
    dt, hidden, d = PL_DTYPES[shape.dtype], shape.hidden, shape.head_dim
    width, qw, kw, positions = shape.q_width + 2 * shape.kv_width, shape.q_width, shape.kv_width, shape.positions
    kvh, write_cache = shape.kv_heads, cache_writer(padded)
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, shape.eps)
    project_rotate = _project_rotate(shape)

    @pl.jit
    def norm_qkv_rope_cache(
        x: pl.Tensor[[T_DYN, hidden], dt],
        residual: pl.InOut[pl.Tensor[[T_DYN, hidden], dt]],
        weight: pl.Tensor[[1, hidden], dt],
        w_qkv: pl.Tensor[[width, hidden], dt],
        pos: pl.Tensor[[T_DYN, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, d], pl.FP32],
        slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        q: pl.Out[pl.Tensor[[T_DYN, qw], dt]],
        k: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        v: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        key_cache: pl.InOut[pl.Tensor[[NB_DYN, block_size, kvh, d], dt]],
        value_cache: pl.InOut[pl.Tensor[[NB_DYN, block_size, kvh, d], dt]],
    ):
        for t in (x, residual, pos, slot_mapping, q, k, v):
            t.bind_dynamic(0, T_DYN)
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
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
        cache_rows = pl.tensor.dim(key_cache, 0) * block_size
        k_flat = pl.reshape(key_cache, [cache_rows, kw])
        v_flat = pl.reshape(value_cache, [cache_rows, kw])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="kv_cache_write"):
            k_flat, v_flat = write_cache(k, v, pl.reshape(slot_mapping, [1, t_dim]), k_flat, v_flat)
        return q, k, v, residual

    return norm_qkv_rope_cache


@functools.lru_cache(maxsize=None)
def embed_qkv_rope_cache_kernel(shape: QkvShape, vocab: int, block_size: int, padded: bool):
    dt, hidden, d = PL_DTYPES[shape.dtype], shape.hidden, shape.head_dim
    width, qw, kw, positions = shape.q_width + 2 * shape.kv_width, shape.q_width, shape.kv_width, shape.positions
    kvh, write_cache = shape.kv_heads, cache_writer(padded)
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, shape.eps)
    project_rotate = _project_rotate(shape)

    @pl.jit
    def embed_qkv_rope_cache(
        ids: pl.Tensor[[T_DYN, 1], pl.INT64],
        table: pl.Tensor[[vocab, hidden], dt],
        weight: pl.Tensor[[1, hidden], dt],
        w_qkv: pl.Tensor[[width, hidden], dt],
        pos: pl.Tensor[[T_DYN, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, d], pl.FP32],
        slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        q: pl.Out[pl.Tensor[[T_DYN, qw], dt]],
        k: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        v: pl.Out[pl.Tensor[[T_DYN, kw], dt]],
        hidden_rows: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
        key_cache: pl.InOut[pl.Tensor[[NB_DYN, block_size, kvh, d], dt]],
        value_cache: pl.InOut[pl.Tensor[[NB_DYN, block_size, kvh, d], dt]],
    ):
        for t in (ids, pos, slot_mapping, q, k, v, hidden_rows):
            t.bind_dynamic(0, T_DYN)
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
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
        cache_rows = pl.tensor.dim(key_cache, 0) * block_size
        k_flat = pl.reshape(key_cache, [cache_rows, kw])
        v_flat = pl.reshape(value_cache, [cache_rows, kw])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="kv_cache_write"):
            k_flat, v_flat = write_cache(k, v, pl.reshape(slot_mapping, [1, t_dim]), k_flat, v_flat)
        return q, k, v, hidden_rows

    return embed_qkv_rope_cache


def _check_cache(name: str, shape: QkvShape, tokens: int, key_cache, value_cache, slot_mapping, padded) -> int:
    """The caches' block size, after checking the caches take the step's k / v rows and the slots are int64 [T]."""
    check_caches(key_cache, value_cache, shape.dtype)
    check(list(key_cache.shape[2:]) == [shape.kv_heads, shape.head_dim], name,
          lambda: f"key_cache must be [num_blocks, block_size, {shape.kv_heads}, {shape.head_dim}] to take the k "
          f"rows, got {describe(key_cache)}")
    check_int("slot_mapping", slot_mapping, [tokens], (torch.int64,))
    check(isinstance(padded, bool), name, lambda: f"padded must be a bool (whether a slot is -1), got {padded!r}")
    return key_cache.shape[1]


def norm_qkv_rope_cache(x, residual, norm_weight, w_qkv, positions, cos_sin, heads, eps, key_cache, value_cache,
                        slot_mapping, padded: bool):
    """norm_qkv_rope(x, residual, ...) -> (q, k, v), and k / v [T, KVH * D] written into key_cache / value_cache
    [num_blocks, block_size, KVH, D] at slot_mapping [T] int64 (-1: not written; see the module for what the
    caller guarantees)."""
    check_float("norm_qkv_rope_cache", "x", x, 2)
    tokens, hidden = x.shape
    shape = _shape("norm_qkv_rope_cache", hidden, x.dtype, norm_weight, w_qkv, positions, tokens, cos_sin, heads,
                   eps)
    check(isinstance(residual, torch.Tensor) and residual.shape == x.shape and residual.dtype == x.dtype and
          residual.is_contiguous(), "norm_qkv_rope_cache",
          lambda: f"residual must be a contiguous {x.dtype} {list(x.shape)} (x's shape), got {describe(residual)}")
    block_size = _check_cache("norm_qkv_rope_cache", shape, tokens, key_cache, value_cache, slot_mapping, padded)
    q, k, v = _outputs(shape, tokens)
    if tokens:
        norm_qkv_rope_cache_kernel(shape, block_size, padded)(
            x.contiguous(), residual, norm_weight.view(1, hidden), w_qkv.contiguous(),
            positions.to(torch.int64).view(-1, 1), cos_sin.contiguous(), slot_mapping, q, k, v, key_cache,
            value_cache)
    return q, k, v


def embed_norm_qkv_rope_cache(ids, table, norm_weight, w_qkv, positions, cos_sin, heads, eps, key_cache,
                              value_cache, slot_mapping, padded: bool):
    """embed_norm_qkv_rope(ids, table, ...) -> (q, k, v, hidden), and k / v written into the caches as
    norm_qkv_rope_cache writes them."""
    check_float("embed_norm_qkv_rope_cache", "table", table, 2)
    check(isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.dtype in (torch.int64, torch.int32),
          "embed_norm_qkv_rope_cache", lambda: f"ids must be a 1-D int64 tensor of token ids, got {describe(ids)}")
    tokens, (vocab, hidden) = ids.shape[0], table.shape
    shape = _shape("embed_norm_qkv_rope_cache", hidden, table.dtype, norm_weight, w_qkv, positions, tokens, cos_sin,
                   heads, eps)
    block_size = _check_cache("embed_norm_qkv_rope_cache", shape, tokens, key_cache, value_cache, slot_mapping,
                              padded)
    q, k, v = _outputs(shape, tokens)
    rows = torch.empty(tokens, hidden, dtype=table.dtype)
    if tokens:
        embed_qkv_rope_cache_kernel(shape, vocab, block_size, padded)(
            ids.to(torch.int64).view(-1, 1), table.contiguous(), norm_weight.view(1, hidden), w_qkv.contiguous(),
            positions.to(torch.int64).view(-1, 1), cos_sin.contiguous(), slot_mapping, q, k, v, rows, key_cache,
            value_cache)
    return q, k, v, rows
