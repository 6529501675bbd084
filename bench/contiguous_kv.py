"""The contiguous-cache baseline of benchmark 14, written in the same DSL as the paged kernels and run on the same
runtime: a cache [B, max_ctx, KVH, D] per request row (no block table), an append of one row per request at its
position (the cache passed as `pl.InOut`) and decode attention over it. Paged / these is the indirection overhead
alone (spec §5.2 items 7-8): same tiles, same online softmax, only the block-table gather replaced by a slice.
max_ctx must be a multiple of KV_TILE (the slices never pass the cache's end).

The append is as lean as the paged write: the same unordered row `pl.mscatter` (positions are distinct by
construction: one row per request), and `append_kv` checks its arguments and positions on the host as
`write_kv_cache` checks its own and the slots. Its scatter clamps (`scatter_oob="clamp"`, the cheapest policy
here: 12 replayed calls, against 15 for "undefined", which checks the bounds again, and 20 for "skip"): a
contiguous cache has no padding slot to skip (a padded request writes its own row, which nothing reads), and the
host check keeps every position in range."""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.attention.attn_errors import (AttentionArgumentError, check_caches, check_int,
                                                    check_new_rows, fail)
from pypto_rt.kernels.attention.paged import KV_TILE, NEG_CAP, longest_length
from pypto_rt.kernels.tile_casts import PL_DTYPES

B_DYN = pl.dynamic("B_DYN")


@functools.lru_cache(maxsize=None)
def append_kernel(max_ctx: int, kv_heads: int, head_dim: int, dtype):
    width = kv_heads * head_dim

    @pl.jit
    def contiguous_append(
        key: pl.Tensor[[B_DYN, kv_heads, head_dim], dtype],
        value: pl.Tensor[[B_DYN, kv_heads, head_dim], dtype],
        key_cache: pl.InOut[pl.Tensor[[B_DYN, max_ctx, kv_heads, head_dim], dtype]],
        value_cache: pl.InOut[pl.Tensor[[B_DYN, max_ctx, kv_heads, head_dim], dtype]],
        positions: pl.Tensor[[B_DYN], pl.INT32],
    ):
        key.bind_dynamic(0, B_DYN)
        value.bind_dynamic(0, B_DYN)
        key_cache.bind_dynamic(0, B_DYN)
        value_cache.bind_dynamic(0, B_DYN)
        positions.bind_dynamic(0, B_DYN)
        batch = pl.tensor.dim(key, 0)
        k_flat = pl.reshape(key_cache, [batch * max_ctx, width])
        v_flat = pl.reshape(value_cache, [batch * max_ctx, width])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="contiguous_append"):
            starts = pl.muls(pl.arange(0, [1, batch], dtype=pl.INT32), max_ctx)
            rows = pl.add(pl.reshape(positions, [1, batch]), starts)
            k_flat = pl.mscatter(pl.reshape(key, [batch, width]), rows, k_flat, coalesce="row",
                                 scatter_oob="clamp", scatter_conflict="default")
            v_flat = pl.mscatter(pl.reshape(value, [batch, width]), rows, v_flat, coalesce="row",
                                 scatter_oob="clamp", scatter_conflict="default")
        return key_cache

    return contiguous_append


def append_kv(key, value, key_cache, value_cache, positions) -> None:
    """Write key/value [B, KVH, D] as row positions[b] of request b's cache key_cache/value_cache
    [B, max_ctx, KVH, D]: the checks `write_kv_cache` makes, positions for slots (each in 0..max_ctx-1, one
    aminmax read on the host), then one kernel call."""
    check_new_rows(key, value, "B")
    check_caches(key_cache, value_cache, key.dtype)
    if list(key_cache.shape[2:]) != list(key.shape[1:]) or key_cache.shape[0] != key.shape[0]:
        fail("key_cache", key_cache, f"[{key.shape[0]}, max_ctx, {key.shape[1]}, {key.shape[2]}] to take key's rows")
    check_int("positions", positions, [key.shape[0]])
    if key.shape[0] == 0:
        return None
    max_ctx = key_cache.shape[1]
    low, high = (int(v) for v in torch.aminmax(positions))
    if low < 0 or high >= max_ctx:
        raise AttentionArgumentError.at_caller(f"positions holds {low if low < 0 else high}, outside the cache's "
                                               f"{max_ctx} rows per request")
    append_kernel(max_ctx, key.shape[1], key.shape[2], PL_DTYPES[key.dtype])(key, value, key_cache, value_cache,
                                                                             positions)
    return None


def _decode_batch(q_heads, kv_heads, head_dim, dtype, scale):
    group = q_heads // kv_heads

    @pl.jit.inline
    def decode_batch(query, lens, longest_len, key_cache, value_cache, out_flat, batch):
        heads, q_rows = batch * kv_heads, batch * q_heads
        q_t = pl.transpose(pl.reshape(query, [heads, group, head_dim]), 1, 2)
        m0 = pl.full([q_rows, 1], dtype=pl.FP32, value=NEG_CAP)
        l0 = pl.full([q_rows, 1], dtype=pl.FP32, value=0.0)
        acc0 = pl.full([heads, group, head_dim], dtype=pl.FP32, value=0.0)
        for kt, (m, l, acc) in pl.range((longest_len + KV_TILE - 1) // KV_TILE, init_values=(m0, l0, acc0)):
            pos = pl.adds(pl.arange(0, [1, KV_TILE], dtype=pl.INT32), kt * KV_TILE)
            k_tile = key_cache[:, kt * KV_TILE : kt * KV_TILE + KV_TILE, :, :]
            v_tile = value_cache[:, kt * KV_TILE : kt * KV_TILE + KV_TILE, :, :]
            k = pl.reshape(pl.transpose(k_tile, 1, 2), [heads, KV_TILE, head_dim])
            v = pl.reshape(pl.transpose(v_tile, 1, 2), [heads, KV_TILE, head_dim])
            scores = pl.reshape(pl.transpose(pl.batch_matmul(k, q_t), 1, 2), [batch, q_heads, KV_TILE])
            live = pl.reshape(pl.cmp(pos, lens, cmp_type=2), [batch, 1, KV_TILE])
            s = pl.reshape(pl.sels(live, pl.muls(scores, scale), scalar=NEG_CAP), [q_rows, KV_TILE])
            m_new = pl.maximum(m, pl.row_max(s))
            p = pl.exp(pl.row_expand_sub(s, m_new))
            alpha = pl.exp(pl.sub(m, m_new))
            l_new = pl.add(pl.mul(l, alpha), pl.row_sum(p))
            pv = pl.batch_matmul(pl.cast(pl.reshape(p, [heads, group, KV_TILE]), target_type=dtype, mode="rint"), v)
            acc_new = pl.add(pl.mul(acc, pl.reshape(alpha, [heads, group, 1])), pv)
            m_out, l_out, acc_out = pl.yield_(m_new, l_new, acc_new)
        o = pl.row_expand_div(pl.reshape(acc_out, [q_rows, head_dim]), pl.maxs(l_out, 1.0e-30))
        out_flat[:, :] = pl.cast(pl.reshape(o, [batch, q_heads * head_dim]), target_type=dtype, mode="rint")
        return out_flat

    return decode_batch


@functools.lru_cache(maxsize=None)
def decode_kernel(max_ctx: int, q_heads: int, kv_heads: int, head_dim: int, dtype, scale: float):
    assert max_ctx % KV_TILE == 0, f"max_ctx {max_ctx} must be a multiple of {KV_TILE}"
    longest, decode_batch = longest_length(), _decode_batch(q_heads, kv_heads, head_dim, dtype, scale)

    @pl.jit
    def contiguous_decode_attention(
        query: pl.Tensor[[B_DYN, q_heads, head_dim], dtype],
        key_cache: pl.Tensor[[B_DYN, max_ctx, kv_heads, head_dim], dtype],
        value_cache: pl.Tensor[[B_DYN, max_ctx, kv_heads, head_dim], dtype],
        seq_lens: pl.Tensor[[B_DYN], pl.INT32],
        out: pl.Out[pl.Tensor[[B_DYN, q_heads, head_dim], dtype]],
    ):
        query.bind_dynamic(0, B_DYN)
        key_cache.bind_dynamic(0, B_DYN)
        value_cache.bind_dynamic(0, B_DYN)
        seq_lens.bind_dynamic(0, B_DYN)
        out.bind_dynamic(0, B_DYN)
        batch = pl.tensor.dim(query, 0)
        out_flat = pl.reshape(out, [batch, q_heads * head_dim])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="contiguous_decode_attention"):
            lens = pl.reshape(seq_lens, [batch, 1])
            decode_batch(query, lens, longest(seq_lens, batch), key_cache, value_cache, out_flat, batch)
        return out

    return contiguous_decode_attention
