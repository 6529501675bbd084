"""Keeping the C heap's top for the process (glibc), so the many small tensors a run makes and frees do not
page-fault back in on every run.

glibc's malloc returns the top of its heap to the system once more than its trim threshold is free there (a
threshold it moves as large blocks are freed) and takes it back with fresh, zeroed pages on the next growth. A
run's tiles are freed and made again at every call, so whether each call pays those page faults depended on the
process's allocation history: the same replayed conformance kernel (c04) took 0.7 ms in some processes and
1.5-2.4 ms in others, every elementwise op 3-6x slower. Asking malloc to keep `PYPTO_HEAP_PAD_MB` of padding at
the heap's top (mallopt M_TOP_PAD) makes it the fast case in every process; the memory stays the process's (it
is reused, not leaked). Applied once per process, by the first engine; a no-op where malloc is not glibc's.

Setting M_TOP_PAD also turns off glibc's dynamic mmap threshold (mallopt(3)): it stayed at 128 KiB, so every block
of 128 KiB or more (a prefill-sized tile, a [1024, 1024] bf16 row block is 2 MiB) was mapped fresh and page-faulted
in on every run and freed back to the system after it (a [1024, 8, 1024] FP32 cast: ~70 ms against ~17 ms into
memory already mapped). The threshold is set where glibc's dynamic rule ends up, its maximum (32 MiB on 64-bit):
blocks below it come from the kept heap.
"""
from __future__ import annotations

import ctypes

from pypto_rt import config

_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3   # glibc malloc.h
MMAP_THRESHOLD = 32 << 20                 # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (4 MiB * sizeof(long))
_applied = False


def keep_heap_top() -> None:
    global _applied
    if _applied:
        return
    pad_mb = config.get_int(config.HEAP_PAD_MB, 0)   # (a malformed value fails every engine until fixed)
    _applied = True
    if not pad_mb:
        return
    try:   # the process's own symbols (libc among them); not ctypes.util.find_library, which forks `ldconfig`
        mallopt = ctypes.CDLL(None).mallopt   # (and a fork makes the parent's next writes page-fault: ~70 ms)
    except (OSError, AttributeError):   # not glibc (macOS, musl without mallopt): nothing to tune
        return
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mallopt(_M_TOP_PAD, pad_mb << 20)
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)   # (M_TOP_PAD froze the dynamic one at 128 KiB)
