"""A host-form job's rank processes never outlive their host, however it ends (SIGKILL, a crash, os._exit).

    host process                                  rank process r (forked)
    ------------                                  -----------------------
    Lifeline(prefix), before any fork:            watch(): a shared flock on /dev/shm/<prefix>+ranks, held until
      a pipe whose write end only it holds,         this process ends, and a thread blocked on the pipe's read end
      and the job's rank lock file                  EOF (the host ended) -> leave(): this rank ends at once, even
    close() once every rank has ended               mid-kernel; a forked copy of that thread alone waits until no
                                                    rank holds the lock and removes /dev/shm/<prefix>+* (the last
                                                    rank out removes the job's segments)

Why a pipe and not prctl(PR_SET_PDEATHSIG): the kernel closes the host's write end however the host ends, and
EOF wakes a thread of the rank's own at once, leaving it time to clean up. A parent-death signal fires on the death
of the forking *thread*, is Linux-only, races with a host that died before the call, and its Python handler runs
only on the main thread between bytecodes (not inside a long kernel); SIGKILL as that signal leaves nobody to
remove the segments, which the dead host no longer can.

Lock invariant: every rank takes its shared lock before it creates any segment, and keeps it until its process
ends (the kernel drops it then). The cleaner's exclusive lock is on a description of its own, so it is granted
only once every rank process, its own included, has ended: no rank thread can create a segment after the removal.
Limit: the pipe's ends are close-on-exec, but a process the host forks later without exec (user code) holds the
write end too, and the ranks outlive the host until it ends. Imports only collective.segments from pypto_rt.
"""
from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading
import time

from pypto_rt.collective.segments import path_of, remove_segments, segment_name

_RANKS_GONE_S = 10.0    # a cleaner's wait for the other ranks to end; after it the segments go anyway
_POLL_S = 0.01


class Lifeline:
    """Made by the host before it forks the ranks; each rank calls `watch()`, the host `close()` after they ended."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.lock_path = path_of(segment_name(prefix, "ranks"))   # a segment name: the job's clean-up removes it
        os.close(os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o600))
        # close-on-exec: only forks inherit the ends, and a rank closes the write end at once (host_end)
        self.reader, self.host_end = multiprocessing.Pipe(duplex=False)

    def close(self) -> None:
        """Host: the job has ended; a rank still alive now ends and cleans up as if the host had died."""
        self.host_end.close()
        self.reader.close()

    def watch(self) -> "_RankWatch":
        """Rank (forked, with the host's write end already closed): hold the job's rank lock for life, and end
        this process when the host ends. A job already being cleaned up ends this process here."""
        try:
            lock = os.open(self.lock_path, os.O_RDONLY)
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)   # fails only while a cleaner holds it
            if os.fstat(lock).st_nlink == 0:
                raise FileNotFoundError(self.lock_path)        # a cleaner removed it before this rank locked it
        except OSError:
            os._exit(1)
        watch = _RankWatch(self.prefix, self.lock_path, lock)
        threading.Thread(target=watch.await_host, args=(self.reader,), name="pypto-rt host lifeline",
                         daemon=True).start()
        return watch


class _RankWatch:
    def __init__(self, prefix: str, lock_path: str, lock: int):
        self.prefix, self.lock_path, self.lock = prefix, lock_path, lock
        self._leaving = threading.Lock()

    def await_host(self, reader) -> None:
        try:
            while True:
                reader.recv_bytes()   # the host never writes: this ends by EOF, when no process holds its end
        except (EOFError, OSError):
            pass
        self.leave()

    def leave(self) -> None:
        """The host ended without ending the job: end this rank process now (never returns). Called by this
        thread, or by the rank's main thread when it sees the host's pipe close first."""
        with self._leaving:   # held until os._exit: one cleaner per rank, whichever thread got here first
            if os.fork() == 0:
                try:
                    self._remove_after_every_rank()
                finally:
                    os._exit(0)
            os._exit(1)

    def _remove_after_every_rank(self) -> None:
        """In the forked cleaner: this thread alone, so nothing here creates a segment. The rank's own lock
        description (shared with the rank) is dropped, so the exclusive lock waits for the rank to end too."""
        try:
            mine = os.open(self.lock_path, os.O_RDONLY)   # exists: the rank's shared lock still holds it
        except FileNotFoundError:
            return
        os.close(self.lock)
        deadline = time.monotonic() + _RANKS_GONE_S
        while time.monotonic() < deadline:
            try:
                fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(_POLL_S)
        remove_segments(self.prefix)
