"""The cache write (vLLM's reshape_and_cache) as a `@pl.jit` kernel built per shape: row i of key/value goes to
slot slot_mapping[i] = block * block_size + offset of caches passed as `pl.InOut`; a slot < 0 writes nothing.

One scatter per cache, whatever the padding: a row whose slot is < 0 is redirected to the largest live slot and
the data of that slot's last writer, so it rewrites what lands there anyway; with no live row at all every row
rewrites slot 0 with the value slot 0 already holds. No other slot is touched (pitfall 1: a -1 never wraps to the
last slot), and the kernel's course never depends on the slots, so calls with changing slot mappings replay.
"""
import functools

import pypto.language as pl

N_DYN = pl.dynamic("N_DYN")
NB_DYN = pl.dynamic("NB_DYN")


def _targets(slot_dtype):
    """An inline `(slots [1, n], n) -> (src [1, n], target [1, n], any_live [1, 1])`: row i writes row src[i]
    of the new rows to slot target[i]. A row whose slot is < 0 takes the largest slot and the row that writes it
    last (the one whose data lands there), with no gather of the slots; with no live row every row targets slot 0
    (any_live false: it rewrites slot 0's own value)."""

    @pl.jit.inline
    def targets(slots, n):
        live = pl.cmps(slots, 0, cmp_type=5)
        iota = pl.arange(0, [1, n], dtype=slot_dtype)     # the slots' dtype: no casts between the two
        top = pl.row_max(slots)
        owner = pl.row_max(pl.sels(pl.cmp(slots, top, cmp_type=0), iota, scalar=-1))
        src = pl.sel(live, iota, owner)
        target = pl.maxs(pl.sel(live, slots, top), 0)
        return src, target, pl.cmps(top, 0, cmp_type=5)

    return targets


def _scatter_rows():
    """An inline `(cache [rows, W], rows_in [n, W], src, target, any_live) -> cache` with the rows written."""

    @pl.jit.inline
    def scatter_rows(cache, rows_in, src, target, any_live):
        fresh = pl.mgather(rows_in, src, coalesce="row")
        cache = pl.scatter_update(cache, 0, target, pl.sel(any_live, fresh, cache[0:1, :]))
        return cache

    return scatter_rows


@functools.lru_cache(maxsize=None)
def cache_write_kernel(block_size: int, kv_heads: int, head_dim: int, dtype, slot_dtype):
    width = kv_heads * head_dim
    targets, scatter_rows = _targets(slot_dtype), _scatter_rows()

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
            src, target, any_live = targets(slots, n)
            k_flat = scatter_rows(k_flat, pl.reshape(key, [n, width]), src, target, any_live)
            v_flat = scatter_rows(v_flat, pl.reshape(value, [n, width]), src, target, any_live)
        return key_cache

    return kv_cache_write
