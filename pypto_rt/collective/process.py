"""This process's place in a multi-rank job: its communicator, its window buffers, and which tensors are windows.

A process is a rank when `pypto-launch` started it (PYPTO_LAUNCHED=1 with RANK / WORLD_SIZE) or when a host-form
program's runtime installed a communicator in it (`install`). The communicator is created on first use: the
first `pld.alloc_window_buffer` (a collective call, so every rank makes it) is the job's rendezvous.

Window tensors are looked up by their storage: `window_of(t)` answers for any view of a window buffer, so a
kernel's `pld.system.notify(signal, ...)` finds the window, its communicator and the byte offset of the cell.
`current_label` is the region `name_hint` of the task running on this thread (for wait reports).
"""
from __future__ import annotations

import threading

from pypto_rt import knobs
from pypto_rt.errors import PyptoError, user_span

from .base import Communicator, Window

_comm: Communicator | None = None
_lock = threading.Lock()
_buffers: dict[int, "WindowBuffer"] = {}     # storage data_ptr of a window's local bytes -> its buffer
_task = threading.local()
_epoch = 0   # bumped whenever the set of window buffers (or the communicator) changes: see epoch()


class WindowBuffer:
    """What `pld.alloc_window_buffer` returns: this rank's part of a symmetric window of `nbytes` bytes."""

    def __init__(self, comm: Communicator, window: Window):
        self.comm = comm
        self.window = window
        self.nbytes = window.nbytes
        self.base = window.local.data_ptr()

    def __repr__(self) -> str:
        return f"<window buffer {self.window.name!r}: {self.nbytes} bytes, rank {self.comm.rank}>"


class HostWindowBuffer:
    """A window buffer allocated by a host-form program: it lives in the rank processes, as their `index`-th
    window; the host only names it in dispatches."""

    def __init__(self, index: int, nbytes: int):
        self.index, self.nbytes = index, nbytes

    def __repr__(self) -> str:
        return f"<host-form window buffer #{self.index}: {self.nbytes} bytes per rank>"


class HostWindowView:
    """What `pld.window(buf, shape, dtype)` gives in a host-form program: each rank binds it to its own view."""

    def __init__(self, buffer: HostWindowBuffer, shape, dtype):
        self.buffer, self.shape, self.dtype = buffer, tuple(int(d) for d in shape), dtype

    def __repr__(self) -> str:
        return f"<window view {list(self.shape)} {self.dtype!r} of {self.buffer!r}>"


_host_form = None   # the running host-form job in this (host) process: alloc and world_size go to it


def set_host_form(job) -> None:
    global _host_form
    _host_form = job


def launched() -> bool:
    return knobs.LAUNCHED.on()


def rank() -> int:
    if _comm is not None:
        return _comm.rank
    return (knobs.get_int(knobs.RANK) or 0) if launched() else 0


def world_size() -> int:
    if _host_form is not None:
        return _host_form.world_size
    if _comm is not None:
        return _comm.world_size
    return (knobs.get_int(knobs.WORLD_SIZE, 1) or 1) if launched() else 1


def install(comm: Communicator) -> None:
    """Make `comm` this process's communicator (a host-form rank process does this before running kernels)."""
    global _comm, _epoch
    _comm = comm
    _epoch += 1


def epoch() -> int:
    """A number that changes whenever a window buffer is allocated or freed or the communicator changes: what
    `window_of` answered for a tensor stays the answer while the epoch and the tensor's address, shape, strides
    and dtype stay the same (ops.distributed keeps a recorded effect's windows resolved by it)."""
    return _epoch


def communicator(what: str) -> Communicator:
    """This process's communicator, created on first use from the launcher's environment."""
    global _comm
    with _lock:
        if _comm is None:
            if not launched():
                raise PyptoError(f"{what} needs a multi-rank job, and this process is not a rank of one",
                                 user_span(3), "start the program with `pypto-launch --nproc N prog.py`, or "
                                 "dispatch chip programs with device=r from a @pl.jit.host program")
            from . import create_communicator
            _comm = create_communicator(knobs.COMM.get() or "shm")
        return _comm


def alloc(nbytes: int, what: str = "pld.alloc_window_buffer") -> WindowBuffer:
    """COLLECTIVE: a zeroed symmetric window buffer of `nbytes` bytes (every rank, same order)."""
    global _epoch
    if _host_form is not None:
        return _host_form.alloc(int(nbytes))
    comm = communicator(what)
    buf = WindowBuffer(comm, comm.alloc_window(int(nbytes), label=what))
    _buffers[buf.window.local.untyped_storage().data_ptr()] = buf
    _epoch += 1
    return buf


def local_buffers() -> list[WindowBuffer]:
    """This rank's window buffers in allocation order (a host-form rank binds window views by index)."""
    return sorted(_buffers.values(), key=lambda b: b.window.index)


def has_windows() -> bool:
    """Whether this process has window buffers at all (else no tensor is a window)."""
    return bool(_buffers)


def window_of(tensor) -> tuple[WindowBuffer, int] | None:
    """(buffer, byte offset of the tensor's first element in it) when `tensor` views a window buffer, else None."""
    if not _buffers:
        return None
    buf = _buffers.get(tensor.untyped_storage().data_ptr())
    if buf is None:
        return None
    return buf, tensor.data_ptr() - buf.base


def close() -> None:
    """End this process's part in the job (an exit barrier: peers may still read this rank's windows)."""
    global _comm, _epoch
    with _lock:
        comm, _comm = _comm, None
        _buffers.clear()
        _epoch += 1
    if comm is not None:
        comm.close()


def abort(why: str) -> None:
    global _comm, _epoch
    with _lock:
        comm, _comm = _comm, None
        _buffers.clear()
        _epoch += 1
    if comm is not None:
        comm.abort(why)


def set_label(label: str | None) -> None:
    _task.label = label


def current_label() -> str | None:
    return getattr(_task, "label", None)
