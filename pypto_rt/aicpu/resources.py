"""What the engines of one `pypto_rt.Runtime` share: the lock guarding every engine's shared state (task states,
fanin counts, ring counters, stats), the condition host waits sleep on, and the worker pool. Imports nothing from
pypto_rt.

Each Runtime owns one `EngineResources`; a plain `@pl.jit` call uses `DEFAULT`, the process's. `current()` is the
one the calling context's runtime installed (`use`), else DEFAULT; an Engine takes it when it is made and keeps
it. Starting threads per run would dominate a small run's cost, so a pool lives as long as its resources and is
replaced only when a run asks for a different size, or when a run closes with a block still running (see
workers.abandon).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import weakref

from .workers import WorkerPool, give_up


class EngineResources:
    """One lock (and its host condition) and one worker pool, shared by the engines of one runtime."""

    def __init__(self, name: str = "default"):
        self.name = name
        self.lock = threading.Lock()
        self.host_cv = threading.Condition(self.lock)
        self._pool: WorkerPool | None = None
        self._pool_lock = threading.Lock()
        _all.add(self)

    def pool(self, size: int, torch_threads: int = 1) -> WorkerPool:
        """The pool, (re)started at `size` lanes of `torch_threads` intra-op threads each.

        One thread per worker is the default: on torch 2.13's CPU wheel an OpenMP team started from a non-main
        thread made every small op ~3 ms (measured: exp on a 32x128 tile, 16 us -> 3.2 ms with 2 threads)."""
        with self._pool_lock:
            pool = self._pool
            if pool is None or (pool.size, pool.torch_threads) != (size, torch_threads):
                if pool is not None:
                    pool.stop()
                pool = self._pool = WorkerPool(size, torch_threads)
            return pool

    def abandon(self, pool: WorkerPool, engine) -> None:
        """Stop using `pool`, which still runs a block of the closed run `engine`: that block is asked to stop, the
        pool's threads end once it has, and the next run starts a fresh pool."""
        with self._pool_lock:
            if self._pool is pool:
                self._pool = None
        give_up(pool, engine)

    def close(self) -> None:
        """Let the pool's threads end after their current block (a later run starts a new pool)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()

    @property
    def pool_size(self) -> int | None:
        """The lanes of the pool now running (None: none started yet)."""
        pool = self._pool
        return None if pool is None else pool.size

    def _forget_pool(self) -> None:
        self._pool, self._pool_lock = None, threading.Lock()


_all: weakref.WeakSet = weakref.WeakSet()
DEFAULT = EngineResources()
_current: contextvars.ContextVar[EngineResources] = contextvars.ContextVar("pypto_rt_engine_resources",
                                                                           default=DEFAULT)


def current() -> EngineResources:
    """The resources of the runtime active in this context (DEFAULT unless a Runtime is active)."""
    return _current.get()


@contextlib.contextmanager
def use(resources: EngineResources):
    """Engines made inside the block (in this context) use `resources`."""
    token = _current.set(resources)
    try:
        yield resources
    finally:
        _current.reset(token)


def _forget_pools_in_child() -> None:
    """A forked process (a host-form rank) has none of its parent's threads: its first run starts a pool."""
    for resources in list(_all):
        resources._forget_pool()


os.register_at_fork(after_in_child=_forget_pools_in_child)
