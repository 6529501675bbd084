"""POSIX shared-memory segments: files under /dev/shm, mapped with mmap, seen as uint8 tensors.

Names: `<prefix>+<rest>`. The job prefix ends at the first `+`, which no prefix may contain (job ids are
letters, digits, `_`, `.`, `-`), so `/dev/shm/<prefix>+*` is exactly one job's segments: job `ab` never matches
job `abc`'s (`pypto-ab+*` against `pypto-abc+...`), whatever ids, pids or random tags the prefixes hold.

Deliberately not `multiprocessing.shared_memory`: on Python 3.11 every attach registers the segment with the
resource_tracker, which unlinks it when the *attaching* process exits, under its peers' feet. Here nothing is
unlinked behind anyone's back; the ownership rule is:
  * a segment is created (O_EXCL, so it starts zeroed) by exactly one rank, whose name it carries (`-r<rank>`);
  * it is unlinked by its owner: the launcher, which removes every /dev/shm/<prefix>+* at job end (also on
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
SEPARATOR = "+"   # ends the prefix in every name; launch/job_segments.py matches on the same character


def path_of(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def check_prefix(prefix: str) -> str:
    """`prefix` if it can name one job's segments: a non-empty file name without the separator."""
    if not prefix or os.sep in prefix or SEPARATOR in prefix or prefix in (".", ".."):
        raise PyptoError(f"bad shared-memory prefix {prefix!r}: it must be a non-empty file name without "
                         f"'{os.sep}' or '{SEPARATOR}'",
                         hint="set PYPTO_SHM_PREFIX (or prefix=) to e.g. pypto-<job id>")
    return prefix


def segment_name(prefix: str, rest: str) -> str:
    """The name of a segment of the job whose prefix is `prefix`."""
    return f"{check_prefix(prefix)}{SEPARATOR}{rest}"


def _space_error(name: str, nbytes: int, err: OSError) -> PyptoError:
    return PyptoError(f"cannot reserve {nbytes} bytes of shared memory for segment {name}: {err.strerror}",
                      hint=f"{SHM_DIR} is full or too small (a container's default is 64 MiB: run it with a "
                           f"larger --shm-size) or remove stale /dev/shm/pypto-* segments of dead jobs")


class SegmentMissing(PyptoError):
    """A peer's segment is not (or no longer) under /dev/shm."""


def removed_error(name: str, rank: int | None, what: str) -> SegmentMissing:
    """A segment of a running job vanished: someone outside the job unlinked it."""
    who = f"rank {rank}: " if rank is not None else ""
    return SegmentMissing(
        f"{who}shared-memory segment {path_of(name)} was removed while the job still uses it, so {what}",
        hint=f"something outside this job unlinked it (a clean-up of /dev/shm, or `rm /dev/shm/...`); segments "
             f"live until the job's launcher (or its communicator) removes /dev/shm/<prefix>{SEPARATOR}* at the end")


class Segment:
    """One mapped segment. `tensor` covers the whole mapping; `cells32`/`cells64` index it as int32/int64.
    `rank`: the rank using this mapping (for errors)."""

    def __init__(self, name: str, mm: mmap.mmap, size: int, owned: bool, rank: int | None = None):
        self.name = name
        self.rank = rank
        self.size = size
        self.owned = owned
        self.mm = mm
        self.tensor = torch.frombuffer(mm, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        self.cells32 = memoryview(mm).cast("i")
        self.cells64 = memoryview(mm).cast("q")
        self.address = self.tensor.data_ptr()   # of byte 0 (futex waits and wakes name cells by address)
        self._thread_lock = threading.Lock()
        self._lock_fd: int | None = None

    @classmethod
    def create(cls, name: str, nbytes: int, rank: int | None = None) -> "Segment":
        """A new zero-filled segment of at least `nbytes` (rounded up to whole pages); fails if it exists."""
        size = max(PAGE, -(-nbytes // PAGE) * PAGE)
        try:
            fd = os.open(path_of(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            raise PyptoError(f"shared-memory segment {path_of(name)} already exists",
                             hint="a job with the same PYPTO_SHM_PREFIX is running or died without cleanup: "
                                  "remove its /dev/shm/<prefix>+* files or use another prefix") from None
        try:
            try:
                os.posix_fallocate(fd, 0, size)   # reserve now: a full /dev/shm is this error, not a later SIGBUS
            except OSError as e:
                os.unlink(path_of(name))
                raise _space_error(name, size, e) from None
            return cls(name, mmap.mmap(fd, size), size, owned=True, rank=rank)
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, name: str, rank: int | None = None) -> "Segment":
        """Map a peer's existing segment (never registers it anywhere; never unlinks it)."""
        try:
            fd = os.open(path_of(name), os.O_RDWR)
        except FileNotFoundError:
            raise SegmentMissing(f"shared-memory segment {path_of(name)} does not exist",
                             hint="its rank has not created it yet, or it was already unlinked (its owner "
                                  "closed, or the launcher cleaned up after a failure)") from None
        try:
            size = os.fstat(fd).st_size
            return cls(name, mmap.mmap(fd, size), size, owned=False, rank=rank)
        finally:
            os.close(fd)

    def locked(self):
        """Exclusive access for a read-modify-write (see the module's atomicity invariant). The lock descriptor
        is opened here, outside the context manager, so a vanished segment fails at the caller's line."""
        with self._thread_lock:
            if self._lock_fd is None:
                try:
                    self._lock_fd = os.open(path_of(self.name), os.O_RDWR)
                except FileNotFoundError:
                    raise removed_error(self.name, self.rank, "its atomic updates cannot be locked") from None
        return self._held()

    @contextlib.contextmanager
    def _held(self):
        with self._thread_lock:
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
    """Names of the segments of the job whose prefix is `prefix` (/dev/shm/<prefix>+*)."""
    return sorted(os.path.basename(p) for p in glob.glob(path_of(glob.escape(segment_name(prefix, ""))) + "*"))


def remove_segments(prefix: str) -> list[str]:
    """The launcher's cleanup: unlink every /dev/shm/<prefix>+* (also after a failed job); returns the names."""
    removed = []
    for name in list_segments(prefix):
        try:
            os.unlink(path_of(name))
            removed.append(name)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
    return removed
