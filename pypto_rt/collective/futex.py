"""Blocking on a shared-memory int32 cell until it may have changed (Linux futex), for the shm communicator's waits.

A wait that blocks here leaves the run queue at once (its core goes to the peer it waits for, which matters when
ranks outnumber cores) and wakes when a peer's signal write is followed by `wake` on the same cell, instead of
sleeping fixed doubling intervals that overshoot the signal (the latency a sleep adds after the peer signalled).
No wake-up is lost: `wait(addr, seen)` sleeps only while the cell still holds `seen` (the kernel compares under
its own lock), and a writer stores the new value before calling `wake`. A shared futex (no FUTEX_PRIVATE_FLAG)
is keyed by the mapped file's page, so ranks in different processes meet on it; the low 32 bits of an int64
cell (little-endian) change with every increment below 2**32, so int64 epochs can be waited on the same way.
Elsewhere than Linux on x86-64 / aarch64 `AVAILABLE` is False and the caller keeps its sleeps.
"""
from __future__ import annotations

import ctypes
import platform
import sys

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 2**31 - 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall():
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None or sys.byteorder != "little":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int]
    return fn


_syscall = _load_syscall()
AVAILABLE = _syscall is not None


def as_int32(value: int) -> int:
    """The int32 a cell's low 32 bits hold when the cell holds `value` (an int32 or int64 cell)."""
    return (int(value) + 2**31) % 2**32 - 2**31


def wait(addr: int, seen: int, timeout_s: float) -> None:
    """Sleep while the int32 at `addr` holds `seen` (as_int32 of the value read), at most `timeout_s`; returns
    early on a wake, a change, a signal or spuriously: the caller re-checks its condition."""
    if timeout_s <= 0:
        return
    sec = int(timeout_s)
    ts = _Timespec(sec, int((timeout_s - sec) * 1e9))
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, as_int32(seen), ctypes.byref(ts), None, 0)


def wake(addr: int) -> None:
    """Wake every wait on the int32 at `addr` (call it after the store it announces)."""
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
