"""The Python entry points a model calls every step (the contract of issue 15): argument checks naming the
argument, then one compiled kernel call each. Shapes follow vLLM: caches [num_blocks, block_size, KVH, D] (a
layer's pool, or a slice of a stacked all-layer pool), block_tables [B, max_blocks] INT32, seq_lens [B] INT32."""
import torch

import pypto.language as pl
from pypto_rt.kernels.attention.attn_errors import (AttentionArgumentError, check_caches, check_int,
                                                    check_new_rows, describe, fail)
from pypto_rt.kernels.attention.cache_write import cache_write_kernel
from pypto_rt.kernels.attention.paged import AttnShape, decode_kernel, decode_tile, prefill_kernel
from pypto_rt.kernels.tile_casts import PL_DTYPES

SLOT_DTYPES = {torch.int32: pl.INT32, torch.int64: pl.INT64}


def _slot_range(slot_mapping, key_cache) -> tuple[int, int]:
    """The smallest and largest slot, read once per call on the host (one aminmax), after checking every slot is
    padding (< 0) or inside the pool (the kernel drops any slot past the pool, as it drops -1, so a slot past it
    would be lost silently)."""
    pool = key_cache.shape[0] * key_cache.shape[1]
    low, high = (int(v) for v in torch.aminmax(slot_mapping))
    if high >= pool or low < -2 ** 31:
        bad = high if high >= pool else low
        raise AttentionArgumentError.at_caller(
            f"slot_mapping holds slot {bad}, outside the pool's {pool} slots ({key_cache.shape[0]} blocks of "
            f"{key_cache.shape[1]}); a slot must be block * block_size + offset in 0..{pool - 1}, or -1 for padding")
    return low, high


def write_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Write key/value [N, KVH, D] into key_cache/value_cache [num_blocks, block_size, KVH, D] in place at
    slot_mapping [N] (int64 or int32; slot = block * block_size + offset); a slot of -1 writes nothing. The live
    slots of one call must be distinct (as vLLM's): if one repeats, which of its rows lands is unspecified."""
    check_new_rows(key, value, "N")
    check_caches(key_cache, value_cache, key.dtype)
    if list(key_cache.shape[2:]) != list(key.shape[1:]):
        fail("key_cache", key_cache, f"[num_blocks, block_size, {key.shape[1]}, {key.shape[2]}] to take key's rows")
    check_int("slot_mapping", slot_mapping, [key.shape[0]], (torch.int64, torch.int32))
    if key.shape[0] == 0:
        return None
    low, high = _slot_range(slot_mapping, key_cache)
    if high < 0:
        return None                                 # every row is padding: nothing to write, no kernel call
    kernel = cache_write_kernel(key_cache.shape[1], key.shape[1], key.shape[2], PL_DTYPES[key.dtype],
                                SLOT_DTYPES[slot_mapping.dtype], padded=low < 0, some_live=True)   # (high >= 0)
    kernel(key, value, key_cache, value_cache, slot_mapping)
    return None


def check_tables(block_tables, seq_lens) -> None:
    """block_tables torch.int32 [batch, max_blocks] and seq_lens torch.int32 [batch] (an error naming either)."""
    if not isinstance(block_tables, torch.Tensor) or block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        fail("block_tables", block_tables, "torch.int32 [batch, max_blocks]")
    check_int("seq_lens", seq_lens, [block_tables.shape[0]])


def _attn_shape(query, key_cache, value_cache, block_tables, seq_lens, scale) -> AttnShape:
    if not isinstance(query, torch.Tensor) or query.dim() != 3 or query.dtype not in PL_DTYPES:
        fail("query", query, f"a tensor [tokens, q_heads, head_dim] of {', '.join(map(str, PL_DTYPES))}")
    check_caches(key_cache, value_cache, query.dtype)
    q_heads, head_dim = query.shape[1], query.shape[2]
    kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_dim or q_heads % kv_heads:
        fail("key_cache", key_cache, f"[num_blocks, block_size, kv_heads, {head_dim}] with kv_heads dividing "
             f"the query's {q_heads} heads")
    check_tables(block_tables, seq_lens)
    scale = head_dim ** -0.5 if scale is None else float(scale)
    return AttnShape(q_heads, kv_heads, head_dim, key_cache.shape[1], block_tables.shape[1],
                     PL_DTYPES[query.dtype], scale)


def _out(query, out):
    if out is None:
        return torch.empty_like(query)              # the kernels write every row
    if not isinstance(out, torch.Tensor) or out.shape != query.shape or out.dtype != query.dtype:
        fail("out", out, f"shaped like query ({describe(query)})")
    return out


def check_max_seq_len(max_seq_len, shape: AttnShape) -> None:
    span = shape.max_blocks * shape.block_size
    if max_seq_len is not None and (isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int)
                                    or not 0 <= max_seq_len <= span):
        fail("max_seq_len", max_seq_len, f"None or an int in 0..{span} (the block table's span: max_blocks "
              f"{shape.max_blocks} x block_size {shape.block_size}), at least every seq_lens entry")


def paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, *, scale=None, out=None,
                           max_seq_len=None):
    """query [B, QH, D] -> out [B, QH, D]: request b attends to positions 0..seq_lens[b]-1 of its blocks (the new
    token's K/V already written); seq_lens[b] == 0 gives zeros. scale defaults to D ** -0.5. max_seq_len: the
    longest seq_lens entry as the host knows it (vLLM's max_seq_len; a serving runner builds seq_lens on the host):
    it sizes the kernel's KV tile (decode_tile). A length past it is still attended in full, at more tiles' cost."""
    shape = _attn_shape(query, key_cache, value_cache, block_tables, seq_lens, scale)
    if block_tables.shape[0] != query.shape[0]:
        fail("block_tables", block_tables, f"one row per query ({query.shape[0]})")
    check_max_seq_len(max_seq_len, shape)
    out = _out(query, out)
    if query.shape[0] == 0:
        return out
    try:
        decode_kernel(shape, decode_tile(shape.block_size, max_seq_len))(query, key_cache, value_cache,
                                                                         block_tables, seq_lens, out)
    except Exception as error:
        explain_lengths(seq_lens, shape, error)
        raise
    return out


def explain_lengths(seq_lens, shape: AttnShape, error: Exception) -> None:
    """After a failed decode only (no host read on the normal path): a length past the block table's span makes
    the kernel's bounds-checked gather fail deep in the kernel; name the argument instead."""
    span = shape.max_blocks * shape.block_size
    past = (seq_lens > span).nonzero().flatten().tolist()
    if past:
        raise AttentionArgumentError.at_caller(
            f"seq_lens[{past[0]}] is {int(seq_lens[past[0]])}; it must be at most {span}, the block table's span "
            f"(max_blocks {shape.max_blocks} x block_size {shape.block_size})",
            "give block_tables enough columns for the longest request") from error


def chunked_prefill_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, *,
                              scale=None, out=None):
    """query [T, QH, D] packed token-major -> out [T, QH, D]: request b's rows qsl[b]:qsl[b+1] sit at positions
    seq_lens[b] - qlen .. seq_lens[b] - 1 and attend causally to the cached context plus the chunk (its K/V
    already written). Rows outside every request (a padded batch's tokens past qsl[B]) are written zeros."""
    shape = _attn_shape(query, key_cache, value_cache, block_tables, seq_lens, scale)
    check_int("query_start_loc", query_start_loc, [block_tables.shape[0] + 1])
    out = _out(query, out)
    if query.shape[0] == 0:
        return out
    if block_tables.shape[0] == 0:
        return out.zero_()                          # every row belongs to no request
    prefill_kernel(shape)(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out)
    return out
