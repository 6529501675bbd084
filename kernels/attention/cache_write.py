"""The cache write (vLLM's reshape_and_cache) as a `@pl.jit` kernel built per shape: row i of key/value goes to
slot slot_mapping[i] = block * block_size + offset of caches passed as `pl.InOut`; a slot < 0 writes nothing.

One row scatter per cache, the ISA's MSCATTER with `coalesce="row"`: `scatter_oob="skip"` drops a row whose slot,
read as uint32, is past the pool (a -1 never wraps to the last slot, pitfall 1; no other slot is touched, and a
step with no live row writes nothing), and `scatter_conflict="default"` spends nothing on ordering repeated
slots, which the caller promises away: the live slots of one call are distinct, as in vLLM (if one repeats,
which of its rows lands is unspecified). The kernel's course never depends on the slots, so calls with changing
slot mappings replay. The caller (`write_kv_cache`) checks the slots against the pool once per call.

Skipping alone costs a spare row (found in O(N), read, and put back in each cache: 18 replayed calls). The caller
(`write_kv_cache`) knows more from its host check, and builds the kernel to match: with no padding (`padded=False`:
every slot inside the pool) the scatter clamps, which moves no in-range slot (10 calls; an append into a contiguous
cache makes 12); with padding and a live slot (`some_live=True`) a -1 row rewrites the live row of the smallest
slot with that row's own data (`some_kept`: 15 calls). A kernel built without `some_live` writes nothing for a call
whose slots are all -1; one built with it raises then (a caller that checked sends no such call).
"""
import functools

import pypto.language as pl

N_DYN = pl.dynamic("N_DYN")
NB_DYN = pl.dynamic("NB_DYN")


@functools.lru_cache(maxsize=None)
def cache_write_kernel(block_size: int, kv_heads: int, head_dim: int, dtype, slot_dtype, padded: bool = True,
                       some_live: bool = False):
    width, oob = kv_heads * head_dim, "skip" if padded else "clamp"
    some_kept = padded and some_live

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
            k_flat = pl.mscatter(pl.reshape(key, [n, width]), slots, k_flat, coalesce="row", scatter_oob=oob,
                                 scatter_conflict="default", some_kept=some_kept)
            v_flat = pl.mscatter(pl.reshape(value, [n, width]), slots, v_flat, coalesce="row", scatter_oob=oob,
                                 scatter_conflict="default", some_kept=some_kept)
        return key_cache

    return kv_cache_write
