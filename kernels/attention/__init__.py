"""Paged attention over a KV cache passed as `pl.InOut` (issue 15): the cache write (slot mapping, -1 skipped),
paged decode attention and chunked-prefill attention. `golden` holds their torch goldens."""
from pypto_rt.kernels.attention.attention_calls import chunked_prefill_attention, paged_decode_attention, write_kv_cache
from pypto_rt.kernels.attention.attn_errors import AttentionArgumentError

__all__ = ["write_kv_cache", "paged_decode_attention", "chunked_prefill_attention", "AttentionArgumentError"]
