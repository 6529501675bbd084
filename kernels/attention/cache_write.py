"""The cache write (vLLM's reshape_and_cache) as a `@pl.jit` kernel built per shape: row i of key/value goes to
slot slot_mapping[i] = block * block_size + offset of caches passed as `pl.InOut`; a slot < 0 writes nothing.

One scatter per cache, whatever the padding: a row whose slot is < 0 is redirected to a spare slot (the smallest
of 0..n that no row's slot names, so no live row writes it) and carries that slot's own current value, so it
rewrites what is already there. No other slot is touched (pitfall 1: a -1 never wraps to the last slot), a step
with no live row rewrites slot 0 with itself, and the kernel's course never depends on the slots, so calls with
changing slot mappings replay. A spare slot exists only if the pool has more than n slots: the caller
(`write_kv_cache`) drops the padding rows on the host for a pool of at most n slots.
"""
import functools

import pypto.language as pl

N_DYN = pl.dynamic("N_DYN")
NB_DYN = pl.dynamic("NB_DYN")


def _spare_slot(slot_dtype):
    """An inline `(slots [1, n], n) -> spare [1, 1]`: the smallest of 0..n that no slot equals (one always
    exists: n slots name at most n of the n + 1 candidates)."""

    @pl.jit.inline
    def spare_slot(slots, n):
        candidates = pl.reshape(pl.arange(0, [1, n + 1], dtype=slot_dtype), [n + 1, 1])   # in the slots' dtype
        taken = pl.row_max(pl.cmp(candidates, slots, cmp_type=0))   # [n + 1, 1] of 0/1
        return pl.col_min(pl.add(pl.muls(taken, n + 1), candidates))   # a taken candidate counts as > n

    return spare_slot


def _write_rows():
    """An inline `(cache [rows, W], rows_in [n, W], live [n, 1], target [1, n], spare [1, 1]) -> cache`: live rows
    written at their target, the others rewrite the spare slot with its own value."""

    @pl.jit.inline
    def write_rows(cache, rows_in, live, target, spare):
        kept = pl.mgather(cache, spare, coalesce="row", gather_oob="clamp")   # the spare slot's value [1, W]
        return pl.scatter_update(cache, 0, target, pl.sel(live, rows_in, kept))

    return write_rows


@functools.lru_cache(maxsize=None)
def cache_write_kernel(block_size: int, kv_heads: int, head_dim: int, dtype, slot_dtype):
    width = kv_heads * head_dim
    spare_slot, write_rows = _spare_slot(slot_dtype), _write_rows()

    @pl.jit
    def kv_cache_write(
        key: pl.Tensor[[N_DYN, kv_heads, head_dim], dtype],
        value: pl.Tensor[[N_DYN, kv_heads, head_dim], dtype],
        key_cache: pl.InOut[pl.Tensor[[NB_DYN, block_size, kv_heads, head_dim], dtype]],
        value_cache: pl.InOut[pl.Tensor[[NB_DYN, block_size, kv_heads, head_dim], dtype]],
        slot_mapping: pl.Tensor[[N_DYN], slot_dtype],
    ):
        key.bind_dynamic(0, N_DYN)
        value.bind_dynamic(0, N_DYN)
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
        slot_mapping.bind_dynamic(0, N_DYN)
        n = pl.tensor.dim(key, 0)
        cache_rows = pl.tensor.dim(key_cache, 0) * block_size
        k_flat = pl.reshape(key_cache, [cache_rows, width])
        v_flat = pl.reshape(value_cache, [cache_rows, width])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="kv_cache_write"):
            slots = pl.reshape(slot_mapping, [1, n])
            spare = spare_slot(slots, n)
            live = pl.cmps(slots, 0, cmp_type=5)
            target = pl.sel(live, slots, spare)
            live_rows = pl.reshape(live, [n, 1])
            k_flat = write_rows(k_flat, pl.reshape(key, [n, width]), live_rows, target, spare)
            v_flat = write_rows(v_flat, pl.reshape(value, [n, width]), live_rows, target, spare)
        return key_cache

    return kv_cache_write
