"""The worker pool: daemon threads that run task blocks, shared by every Engine of the process.

Starting threads per run would dominate a small run's cost, so one pool lives at module level and is replaced
only when a run asks for a different size, or when a run closes with a block still running (a kernel that may
never return must not hold a lane of the next run). Work items are engine tokens on one FIFO, one per queued
block; the pool knows nothing about them beyond calling `engine.run_queued(lane)`, which claims a block (the
host may have claimed it first). Imports nothing from pypto_rt.
"""
from __future__ import annotations

import os
import threading
from queue import SimpleQueue

import torch


class WorkerPool:
    """`size` daemon threads (lanes 0..size-1) serving `queue`, a FIFO of engine tokens, each with
    `torch_threads` intra-op threads; `stop()` lets each thread exit after its current item."""

    def __init__(self, size: int, torch_threads: int):
        self.size = size
        self.torch_threads = torch_threads
        self.queue: SimpleQueue = SimpleQueue()
        # torch.set_num_threads is per calling thread on torch's CPU builds (checked on 2.13: a worker that sets
        # 1 runs at one thread while the host keeps its own count), so each worker sets its own count.
        for lane in range(size):
            threading.Thread(target=self._serve, args=(lane, torch_threads), name=f"pypto-rt worker {lane}",
                             daemon=True).start()

    def stop(self) -> None:
        for _ in range(self.size):
            self.queue.put(None)

    def _serve(self, lane: int, torch_threads: int) -> None:
        torch.set_num_threads(torch_threads)
        get = self.queue.get
        while (item := get()) is not None:
            item.run_queued(lane)


def set_torch_threads(n: int) -> int:
    """Set the calling thread's torch intra-op thread count; returns the previous one."""
    previous = torch.get_num_threads()
    if previous != n:
        torch.set_num_threads(n)
    return previous


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def shared_pool(size: int, torch_threads: int = 1) -> WorkerPool:
    """The process's pool, (re)started at `size` lanes of `torch_threads` intra-op threads each.

    One thread per worker is the default: on torch 2.13's CPU wheel an OpenMP team started from a non-main
    thread made every small op ~3 ms (measured: exp on a 32x128 tile, 16 us -> 3.2 ms with 2 threads)."""
    global _pool
    with _pool_lock:
        if _pool is None or (_pool.size, _pool.torch_threads) != (size, torch_threads):
            if _pool is not None:
                _pool.stop()
            _pool = WorkerPool(size, torch_threads)
        return _pool


def _forget_pool_in_child() -> None:
    """A forked process (a host-form rank) has none of its parent's threads: its first run starts a pool."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def abandon(pool: WorkerPool) -> None:
    """Stop using `pool` (a lane may be stuck in a kernel); the next run starts a fresh one."""
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = None
    pool.stop()
