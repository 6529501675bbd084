"""The compiled tier's background worker (replay.tier, PYPTO_TIER=background): one daemon thread per process running
compile jobs from a bounded queue, stopped cleanly when the process exits. A job sends its build to the compile
process (replay.tier_process, at the lowest CPU priority) and waits for it without the interpreter lock; on this
thread remain loading the compiled code and checking it against the replay.

Priority: the thread keeps the process's priority. The compile's CPU and its C++ compiler are the compile process's,
at nice 19; what is left here is short (loading the module, checking it), and at nice 19 this thread, preempted
while holding the interpreter lock for it, stalled the calling thread (bench.tier_priority: 0.65-1.0 s at a load of
6-11 against 0.09 s at normal priority, docs/benchmarks.md).

Exit: a daemon thread still inside torch's C++ code (which releases the GIL) when the interpreter finalizes is
ended as it takes the GIL back, inside C++ frames, and the process aborts ("terminate called without an active
exception", exit status 134). So at exit a worker with a job is stopped at its next Python line (an exception
raised in it) and waited for, at most `EXIT_WAIT_S`; the job's specialisation needs no cleanup (the process ends).

Fork: a child has no worker (fork copies only the calling thread); its first job starts its own.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import queue
import sys
import threading
import time

from pypto_rt import config

EXIT_WAIT_S = 10.0   # at exit, how long a worker stopped in a job is waited for
_jobs: queue.Queue = queue.Queue(maxsize=16)
_worker: list = []   # the one worker thread, once started
_start_lock = threading.Lock()


class _Exiting(BaseException):
    """Raised in the worker when the process exits during a job (not an Exception: jobs catch those)."""


def submit(job) -> bool:
    """Queue `job` for the worker thread (started on first use); False when the queue is full."""
    ensure_worker()
    try:
        _jobs.put_nowait(job)
    except queue.Full:
        return False
    return True


def ensure_worker() -> None:
    """Start the worker thread (once per process) and wait, bounded, until it runs; with PYPTO_STATS=1 say where
    it compiles."""
    if _worker:
        return
    with _start_lock:
        if _worker:
            return
        ready = threading.Event()
        thread = threading.Thread(target=_work, args=(ready,), name="pypto-rt-tier", daemon=True)
        thread.start()
        ready.wait(5.0)
        _worker.append(thread)
        atexit.register(_stop_at_exit)   # (runs before the handlers torch registered earlier)
    if config.STATS.get() == "1":
        print(f"pypto-rt stats: the compiled tier compiles {where()}", file=sys.stderr)


def where() -> str:
    """Where a compile asked for here runs, as the tier's text says it."""
    from pypto_rt.replay import tier_process

    if config.TIER.get() != "background":
        return f"in a compile process {tier_process.priority(False)}, the call waiting"
    return f"in the background, in a compile process {tier_process.priority(True)}"


def wait_idle(timeout_s: float) -> bool:
    """Wait until the worker has no job (tests, benchmarks); False when `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    while _jobs.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _work(ready: threading.Event) -> None:
    ready.set()
    try:
        while True:
            job = _jobs.get()
            try:
                job()
            finally:
                _jobs.task_done()
    except _Exiting:   # (the process is exiting: the job stops where it is)
        return


def _stop_at_exit() -> None:
    """atexit: stop a worker that has a job at its next Python line and wait for it (see the module text)."""
    if not _worker or not _jobs.unfinished_tasks:
        return
    thread = _worker[0]
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Exiting))
    try:
        _jobs.put_nowait(lambda: None)   # (a worker that went idle meanwhile wakes, and the exception lands)
    except queue.Full:
        pass
    thread.join(EXIT_WAIT_S)


def _forget_worker_after_fork() -> None:
    """In a forked child the worker thread is gone while `_worker` still names it: a fresh queue, lock and no
    worker, so the child's first job starts its own thread."""
    global _jobs, _start_lock
    _jobs, _start_lock = queue.Queue(maxsize=16), threading.Lock()
    _worker.clear()


os.register_at_fork(after_in_child=_forget_worker_after_fork)
