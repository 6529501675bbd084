"""POSIX shared-memory segments: files under /dev/shm, mapped with mmap, seen as uint8 tensors.

Deliberately not `multiprocessing.shared_memory`: on Python 3.11 every attach registers the segment with the
resource_tracker, which unlinks it when the *attaching* process exits, under its peers' feet. Here nothing is
unlinked behind anyone's back; the ownership rule is:
  * a segment is created (O_EXCL, so it starts zeroed) by exactly one rank, whose name it carries (`-r<rank>`);
  * it is unlinked by its owner: the launcher, which removes every /dev/shm/<prefix>* at job end (also on
    failure, with `remove_segments`), or, for a communicator that owns its segments, the creating rank at close;
  * unlinking or dropping a mapping never invalidates a peer's mapping (the pages live while any map does).
Mappings are never closed explicitly: tensors handed out keep the mmap alive, so a window tensor kept past close
stays valid memory instead of a segfault; the OS unmaps when the last view goes.

Atomicity invariant: every read-modify-write of a segment's bytes holds `Segment.locked()`: the segment's own
threading lock (threads sharing this mapping) plus flock(LOCK_EX) on a file descriptor this Segment opened
itself. flock locks belong to the open file description, so they exclude other processes *and* other Segment
objects of the same process (host form: one communicator per rank thread), and closing any other descriptor
never drops them. Plain loads and stores of aligned int32/int64 cells take no lock: they are single accesses.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import mmap
import os
import threading

import torch

from pypto_rt.errors import PyptoError

SHM_DIR = "/dev/shm"
PAGE = 4096


def path_of(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def _space_error(name: str, nbytes: int, err: OSError) -> PyptoError:
    return PyptoError(f"cannot reserve {nbytes} bytes of shared memory for segment {name}: {err.strerror}",
                      hint=f"{SHM_DIR} is full or too small (a container's default is 64 MiB: run it with a "
                           f"larger --shm-size) or remove stale /dev/shm/pypto-* segments of dead jobs")


class SegmentMissing(PyptoError):
    """A peer's segment is not (or no longer) under /dev/shm."""


class Segment:
    """One mapped segment. `tensor` covers the whole mapping; `cells32`/`cells64` index it as int32/int64."""

    def __init__(self, name: str, mm: mmap.mmap, size: int, owned: bool):
        self.name = name
        self.size = size
        self.owned = owned
        self.mm = mm
        self.tensor = torch.frombuffer(mm, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        self.cells32 = memoryview(mm).cast("i")
        self.cells64 = memoryview(mm).cast("q")
        self._thread_lock = threading.Lock()
        self._lock_fd: int | None = None

    @classmethod
    def create(cls, name: str, nbytes: int) -> "Segment":
        """A new zero-filled segment of at least `nbytes` (rounded up to whole pages); fails if it exists."""
        size = max(PAGE, -(-nbytes // PAGE) * PAGE)
        try:
            fd = os.open(path_of(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            raise PyptoError(f"shared-memory segment {path_of(name)} already exists",
                             hint="a job with the same PYPTO_SHM_PREFIX is running or died without cleanup: "
                                  "remove its /dev/shm/<prefix>* files or use another prefix") from None
        try:
            try:
                os.posix_fallocate(fd, 0, size)   # reserve now: a full /dev/shm is this error, not a later SIGBUS
            except OSError as e:
                os.unlink(path_of(name))
                raise _space_error(name, size, e) from None
            return cls(name, mmap.mmap(fd, size), size, owned=True)
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """Map a peer's existing segment (never registers it anywhere; never unlinks it)."""
        try:
            fd = os.open(path_of(name), os.O_RDWR)
        except FileNotFoundError:
            raise SegmentMissing(f"shared-memory segment {path_of(name)} does not exist",
                             hint="its rank has not created it yet, or it was already unlinked (its owner "
                                  "closed, or the launcher cleaned up after a failure)") from None
        try:
            size = os.fstat(fd).st_size
            return cls(name, mmap.mmap(fd, size), size, owned=False)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def locked(self):
        """Exclusive access for a read-modify-write (see the module's atomicity invariant)."""
        with self._thread_lock:
            if self._lock_fd is None:
                self._lock_fd = os.open(path_of(self.name), os.O_RDWR)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def release(self, unlink: bool = False) -> None:
        """Close the lock descriptor and unlink if asked (owner only). The mapping itself goes when the last
        reference (this object, a tensor view, a wait still polling a cell) does: never under a reader."""
        with self._thread_lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
        if unlink:
            unlink_segment(self.name)


def unlink_segment(name: str) -> bool:
    try:
        os.unlink(path_of(name))
        return True
    except FileNotFoundError:
        return False


def list_segments(prefix: str) -> list[str]:
    """Names of the segments under /dev/shm that start with `prefix`."""
    if not prefix or os.sep in prefix:
        raise PyptoError(f"bad shared-memory prefix {prefix!r}: it must be a non-empty file name")
    return sorted(os.path.basename(p) for p in glob.glob(path_of(glob.escape(prefix)) + "*"))


def remove_segments(prefix: str) -> list[str]:
    """The launcher's cleanup: unlink every /dev/shm/<prefix>* (also after a failed job); returns the names."""
    removed = []
    for name in list_segments(prefix):
        try:
            os.unlink(path_of(name))
            removed.append(name)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
    return removed
