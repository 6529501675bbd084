"""The compiled tier's background worker (replay.tier, PYPTO_TIER=background): one daemon thread per process running
compile jobs from a bounded queue, at the lowest CPU priority, stopped cleanly when the process exits. A job sends
its build to the compile process (replay.tier_process, itself at nice 19) and waits for it without the interpreter
lock; on this thread remain loading the compiled code and checking it against the replay.

Priority: the thread lowers its own nice value to 19 (Linux: nice is per thread), and what it starts inherits it:
the OpenMP threads of the compiled code it checks. A busy job's threads then get the cores first; the compile takes
what they leave idle. Where lowering is refused, or not on Linux, it runs at normal priority and says so
(`priority`, shown by PYPTO_STATS).

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

IDLE_NICE = 19       # the worker's nice value: the lowest CPU priority
EXIT_WAIT_S = 10.0   # at exit, how long a worker stopped in a job is waited for
_jobs: queue.Queue = queue.Queue(maxsize=16)
_worker: list = []   # the one worker thread, once started
_start_lock = threading.Lock()
priority = ""        # how the worker runs: at idle priority, or at normal priority and why (once started)


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
    """Start the worker thread (once per process) and wait, bounded, until it has set its priority; with
    PYPTO_STATS=1 say at which priority it compiles."""
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
        print(f"pypto-rt stats: the compiled tier compiles in the background, in a compile process; its worker thread "
              f"waits for it and checks its code {priority}", file=sys.stderr)


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


def _lower_priority() -> str:
    """Lower this thread's CPU priority to the lowest; how it runs."""
    if not sys.platform.startswith("linux"):
        return f"at normal priority (a thread's own priority is set on Linux only; this is {sys.platform})"
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), IDLE_NICE)
    except OSError as e:
        return f"at normal priority (lowering it was refused: {e})"
    return f"at idle priority, nice {IDLE_NICE}"


def _work(ready: threading.Event) -> None:
    global priority
    priority = _lower_priority()
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
    global _jobs, _start_lock, priority
    _jobs, _start_lock, priority = queue.Queue(maxsize=16), threading.Lock(), ""
    _worker.clear()


os.register_at_fork(after_in_child=_forget_worker_after_fork)
