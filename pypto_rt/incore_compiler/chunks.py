"""How many pieces a coalesced loop runs as, decided at run time from the sizes it touches.

A coalesced loop (coalesce.py) runs as one task per worker over all its iterations, and a merged inner tile loop
as one wide pass; either would make temporaries as large as the tensors it covers. PYPTO_COALESCE_CHUNK_MB bounds
the tile data one task or pass may span, so a loop's working set per worker stays fixed whatever the tensor size.
"""
from __future__ import annotations

from pypto_rt import config
from pypto_rt.ops.value import TensorValue

# a coalesced chunk writes at least this much: smaller ones cost more in thread hand-offs than they gain
MIN_CHUNK_BYTES = 256 * 1024


def chunk_count(n: int, workers: int, written: int, per_iteration: int, cap: int) -> int:
    """How many tasks a coalesced loop of `n` iterations (writing `written` bytes in all) runs as: one per worker
    when each still writes MIN_CHUNK_BYTES, and enough that no task spans more than `cap` bytes of tile data, each
    iteration adding `per_iteration` (0: no bound). The bound keeps a loop's temporaries (a tile's copy, an op's
    result) to a fixed working set per worker, whatever the tensor's size."""
    count = min(n, workers, max(1, written // MIN_CHUNK_BYTES))
    if cap and per_iteration:
        most = max(1, cap // per_iteration)   # iterations one task may take
        count = max(count, -(-n // most))
    return count


def chunk_cap() -> int:
    """PYPTO_COALESCE_CHUNK_MB in bytes (0: no bound)."""
    mb = config.get_int(config.COALESCE_CHUNK_MB)
    return (int(config.COALESCE_CHUNK_MB.default) if mb is None else mb) * 2**20


def wide_chunks(count, step, tensors: tuple) -> list[tuple[int, int]]:
    """(offset, width) pieces of a merged tile loop of `count` steps of `step`: one, or as many as keep the
    tensors its body touches (TensorValues) at most `chunk_cap()` bytes per piece when the loop spans them."""
    count, step = int(count), int(step)   # (int() pins a bound read from data, as loop_range does)
    cap = chunk_cap()
    total = sum(t.data.numel() * t.data.element_size() for t in tensors if type(t) is TensorValue) if cap else 0
    pieces = min(count, -(-total // cap)) if total > cap else 1
    if pieces <= 1:
        return [(0, count * step)]
    most = -(-count // pieces)
    return [(first * step, min(most, count - first) * step) for first in range(0, count, most)]
