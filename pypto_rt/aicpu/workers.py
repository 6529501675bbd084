"""The worker pool: daemon threads that run task blocks, shared by the Engines of one runtime (aicpu.resources
owns it). A pool is replaced when a run closes with a block still running (a kernel that may never return must
not hold a lane of the next run). Work items are engine tokens on one FIFO, one per queued
block; the pool knows nothing about them beyond calling `engine.run_queued(lane)`, which claims a block (the
host may have claimed it first). Imports nothing from pypto_rt.

Ending: workers are daemon threads, so a kernel that never returns cannot keep the process alive. But a daemon
thread that re-takes the GIL inside torch's C++ frames while the interpreter is torn down unwinds into
`std::terminate` (exit 134, "terminate called without an active exception"). So an abandoned pool's threads are
asked to leave their kernel at its next Python step (`RunAbandoned`), and at interpreter exit, before anything is
torn down, `_end_abandoned` waits a bounded time for them; one still inside a kernel then ends the process at
once (atexit handlers run, streams flushed, `os._exit`) instead of letting teardown abort it.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time
from queue import SimpleQueue

import torch

EXIT_GRACE_S = 5.0   # how long interpreter exit waits for abandoned workers to leave their kernels


class RunAbandoned(BaseException):
    """Raised inside a block whose run was closed while it ran, at the kernel's next Python step (an op already
    running finishes first). A BaseException, so a kernel's own `except Exception` does not swallow it."""


class WorkerPool:
    """`size` daemon threads (lanes 0..size-1) serving `queue`, a FIFO of engine tokens, each with
    `torch_threads` intra-op threads; `stop()` lets each thread exit after its current item."""

    def __init__(self, size: int, torch_threads: int):
        self.size = size
        self.torch_threads = torch_threads
        self.queue: SimpleQueue = SimpleQueue()
        # thread ident -> the engine whose token it is serving; written under `_busy_lock`, so a stop request
        # (`stop_blocks_of`) always lands while the thread is still serving that engine, never in a later item
        self._busy: dict[int, object] = {}
        self._busy_lock = threading.Lock()
        # torch.set_num_threads is per calling thread on torch's CPU builds (checked on 2.13: a worker that sets
        # 1 runs at one thread while the host keeps its own count), so each worker sets its own count.
        torch.get_num_threads()   # (the creating thread's own count is fixed now, not taken from a worker's: see _serve)
        self.threads = [threading.Thread(target=self._serve, args=(lane, torch_threads),
                                         name=f"pypto-rt worker {lane}", daemon=True) for lane in range(size)]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for _ in range(self.size):
            self.queue.put(None)

    def stop_blocks_of(self, engine) -> None:
        """Ask every thread serving `engine` to leave its block at the next Python step (see RunAbandoned)."""
        with self._busy_lock:
            for ident, item in self._busy.items():
                if item is engine:
                    _raise_in_thread(ident, RunAbandoned)

    def _serve(self, lane: int, torch_threads: int) -> None:
        # torch gives a thread its count lazily, at its first op that asks, from the last count any thread set
        # (lazy_init_num_threads, torch 2.13): ask once first, or a count the host sets before this thread's first
        # op would replace this one (measured: a worker's matmul ran on 2 threads, other bits than on the host)
        torch.get_num_threads()
        torch.set_num_threads(torch_threads)
        get, busy, busy_lock, me = self.queue.get, self._busy, self._busy_lock, threading.get_ident()
        try:
            while (item := get()) is not None:
                with busy_lock:
                    busy[me] = item
                item.run_queued(lane)   # a kernel's own failure (RunAbandoned included) is its task's error
                with busy_lock:
                    del busy[me]
        except RunAbandoned:   # landed after the kernel returned: only an abandoned pool is asked, so end here
            with busy_lock:
                busy.pop(me, None)


def _raise_in_thread(ident: int, exc_type: type) -> None:
    """`exc_type` is raised in thread `ident` at its next Python step (CPython's async exception)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))


def set_torch_threads(n: int) -> int:
    """Set the calling thread's torch intra-op thread count; returns the previous one."""
    previous = torch.get_num_threads()
    if previous != n:
        torch.set_num_threads(n)
    return previous


_abandoned: list[WorkerPool] = []   # pools given up while a block ran: interpreter exit waits for them
_exit_code: int | None = None       # what the process exits with, where a runner told us (pypto-run)


def _forget_abandoned_in_child() -> None:
    """A forked process (a host-form rank) has none of its parent's threads."""
    global _exit_code
    _exit_code = None
    _abandoned.clear()


os.register_at_fork(after_in_child=_forget_abandoned_in_child)


def give_up(pool: WorkerPool, engine) -> None:
    """`pool` (no longer its owner's) still runs a block of the closed run `engine`: ask that block to stop and the
    pool's threads to end once it has; interpreter exit waits for them (`_end_abandoned`)."""
    _abandoned.append(pool)
    pool.stop_blocks_of(engine)
    pool.stop()


def exiting_with(code: int) -> None:
    """A runner (pypto-run) says which code the process is about to exit with, for `_end_abandoned`."""
    global _exit_code
    _exit_code = code


def _end_abandoned() -> None:
    """At interpreter exit, before teardown: wait up to EXIT_GRACE_S for abandoned workers to end; if one is still
    inside a kernel, end the process here (teardown would abort it, see the module docstring)."""
    threads = [t for pool in _abandoned for t in pool.threads if t.is_alive()]
    deadline = time.monotonic() + EXIT_GRACE_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if not stuck:
        return
    code = 1 if _exit_code is None else _exit_code   # a plain script's own code is not visible here
    print(f"pypto-rt: {', '.join(stuck)} still inside a kernel of a closed run {EXIT_GRACE_S:.0f} s after exit "
          f"began; ending the process now with exit code {code} (interpreter teardown would abort in torch)",
          file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


threading._register_atexit(_end_abandoned)   # runs before non-daemon threads are joined and before atexit
