"""Paged attention over a KV cache passed as `pl.InOut` (issue 15): the cache write (slot mapping, -1 skipped),
paged decode attention and chunked-prefill attention."""
