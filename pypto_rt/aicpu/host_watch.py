"""The watchdog of blocks the host runs itself: no hang without a report, even on the host thread.

A host thread inside a kernel cannot wait with a deadline, so one daemon thread per process looks at
the blocks hosts are running; a block that runs past its engine's timeout gets the engine's stall
report on stderr, and the main thread is interrupted (a KeyboardInterrupt at its next Python step).
The interrupt is a SIGINT where Python handles SIGINT; in a process that ignores it (started as a background
job of a non-interactive shell, or a program that set SIG_IGN) a SIGINT would be lost and the block would hang,
so there it is a real-time signal of the watchdog's own whose handler raises KeyboardInterrupt, installed by the
main thread when it first runs a block (where the platform has one and nobody handles it).
Imports nothing from pypto_rt beyond the engine's own modules.
"""
from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time

_lock = threading.Lock()
_running: dict[int, tuple] = {}      # id(engine) -> (engine, task, started perf_counter_ns, reported)
_thread_started = False
_wake_signal = signal.SIGINT          # what _interrupt_main sends (see the module)
_OWN_SIGNAL = getattr(signal, "SIGRTMIN", None)


def _reset_in_child() -> None:
    """A forked process has no watchdog thread yet (and no blocks running)."""
    global _thread_started, _lock, _wake_signal
    _thread_started, _lock, _wake_signal = False, threading.Lock(), signal.SIGINT
    _running.clear()


os.register_at_fork(after_in_child=_reset_in_child)


def entering(engine, task, started_ns: int | None = None) -> None:
    """Host thread: it starts running `task` itself. No lock: one dict store is atomic, and the watchdog reads a
    snapshot (this runs once per task the host runs, so it must cost next to nothing)."""
    global _thread_started
    _running[id(engine)] = (engine, task, time.perf_counter_ns() if started_ns is None else started_ns, False)
    if not _thread_started:
        with _lock:
            if not _thread_started:
                _thread_started = True
                _choose_wake_signal()
                threading.Thread(target=_watch, name="pypto-rt host watchdog", daemon=True).start()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _choose_wake_signal() -> None:
    """SIGINT where Python handles it; else, on the main thread, the watchdog's own real-time signal (see the
    module). Installing a handler needs the main thread; elsewhere SIGINT stays (as before)."""
    global _wake_signal
    if callable(signal.getsignal(signal.SIGINT)) or _OWN_SIGNAL is None or \
            threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(_OWN_SIGNAL) == signal.SIG_DFL:
            signal.signal(_OWN_SIGNAL, _raise_interrupt)
            _wake_signal = _OWN_SIGNAL
    except (OSError, ValueError):   # (no such signal here, or not the main thread after all)
        pass


def leaving(engine) -> None:
    _running.pop(id(engine), None)


def _watch() -> None:
    while True:
        time.sleep(0.25)
        now = time.perf_counter_ns()
        late = [(key, entry) for key, entry in list(_running.items())   # a snapshot: hosts change it meanwhile
                if not entry[3] and now - entry[2] > entry[0].timeout_s * 1e9]
        for key, entry in late:
            if _running.get(key) is entry:   # still running that block: report it once
                _running[key] = entry[:3] + (True,)
        for _, (engine, task, started, _) in late:
            report = engine.stall_report()
            engine.host_stall = report
            print(report.render() + f"\n   = note: task {task.label} is running on the host thread, which cannot "
                  "be stopped; interrupting the main thread (set PYPTO_HOST_INLINE_US=0 to keep kernels on "
                  "workers)", file=sys.stderr, flush=True)
            _interrupt_main()


def _interrupt_main() -> None:
    """A real signal to the main thread (SIGINT, or the watchdog's own: see the module): it also ends a wait inside
    C code (a lock, an Event), where `_thread.interrupt_main` alone would only be noticed after the wait."""
    try:
        signal.pthread_kill(threading.main_thread().ident, _wake_signal)
    except (AttributeError, OSError, ValueError):
        _thread.interrupt_main()
