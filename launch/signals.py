"""`SignalWatch`: while a job runs, SIGINT/SIGTERM/SIGHUP to the launcher are recorded, not raised.

The handler only appends the signal number; the wake-up socket (`fileno()`) makes the supervisor's `select`
return at once, so Ctrl-C is acted on immediately and never surfaces as a Python traceback. Outside the main
thread (where handlers cannot be installed) the watch is inert.
"""
from __future__ import annotations

import signal
import socket
import threading

WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalWatch:
    def __init__(self):
        self.pending: list[int] = []
        self._old: dict[int, object] = {}
        self._old_wakeup = -1
        self._rsock = self._wsock = None

    def fileno(self) -> int | None:
        return self._rsock.fileno() if self._rsock is not None else None

    def drain(self) -> None:
        """Empty the wake-up socket (the signal numbers themselves are in `pending`)."""
        if self._rsock is None:
            return
        try:
            while self._rsock.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def __enter__(self) -> "SignalWatch":
        if threading.current_thread() is not threading.main_thread():
            return self
        self._rsock, self._wsock = socket.socketpair()
        for s in (self._rsock, self._wsock):
            s.setblocking(False)
        self._old_wakeup = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        for sig in WATCHED:
            self._old[sig] = signal.signal(sig, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.pending.append(signum)

    def __exit__(self, *exc) -> None:
        if self._rsock is None:
            return
        for sig, old in self._old.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._old_wakeup)
        self._rsock.close()
        self._wsock.close()
        self._rsock = self._wsock = None
