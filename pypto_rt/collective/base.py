"""The communicator interface every backend implements, the op names it takes, and the errors it raises.

A communicator moves bytes between the ranks of one job: symmetric windows with int32 signal cells and one-sided
access (backends that map peers' memory), and host collectives (every backend). Blocking methods take `label=` (a
caller's context string, e.g. a region's name_hint) that goes into timeout reports. Imports only pypto_rt.errors
and pypto_rt.config from pypto_rt.
"""
from __future__ import annotations

import abc
import atexit
import weakref

import torch

from pypto_rt.errors import NotSupportedError, PlatformError, PyptoError

REDUCE_OPS = ("sum", "max", "min")
NOTIFY_OPS = ("set", "atomic_add")
WAIT_CMPS = ("eq", "ge")
_ALIASES = {"atomicadd": "atomic_add", "add": "atomic_add"}


def _name(op) -> str:
    """'Sum', ReduceOp.Sum, NotifyOp.AtomicAdd, dist.ReduceOp.SUM -> 'sum' / 'atomicadd' (duck-typed on .name)."""
    raw = getattr(op, "name", op)
    return str(raw).lower().replace("_", "")


def _choose(op, allowed: tuple[str, ...], what: str) -> str:
    name = _name(op)
    name = _ALIASES.get(name, name)
    if name not in allowed:
        raise PyptoError(f"{what} {op!r} is not one of {', '.join(allowed)}")
    return name


def reduce_op(op) -> str:
    return _choose(op, REDUCE_OPS, "reduce op")


def notify_op(op) -> str:
    return _choose(op, NOTIFY_OPS, "notify op")


def wait_cmp(cmp) -> str:
    return _choose(cmp, WAIT_CMPS, "wait comparison")


# ---------------------------------------------------------------------------------------------------- errors

class CommError(PyptoError):
    """A multi-rank operation failed on this rank. `.wait` (when set) is its machine-readable wait record."""

    def __init__(self, message: str, hint: str | None = None, wait: dict | None = None):
        super().__init__(message, hint=hint)
        self.wait = wait


class CommTimeoutError(CommError):
    """A blocking wait passed its deadline. `.wait` has the keys of `waits.WAIT_KEYS`; `waits.merge_reports`
    joins the records of all ranks into one cross-rank wait-for picture."""


class PeerAbortedError(CommError):
    """A rank this one waited on aborted (raised), closed, or died; that rank's own error is the root cause."""


class CollectiveMismatchError(CommError):
    """Ranks called different collectives (or the same one with different shapes) at the same point."""


class BackendUnavailableError(PlatformError):
    """A communicator backend whose library or device this machine does not have."""


def unsupported(backend: str, op: str, instead: str) -> NotSupportedError:
    return NotSupportedError(f"the {backend} communicator cannot do {op}", hint=instead)


# ---------------------------------------------------------------------------------------------------- interface

class Window:
    """A symmetric buffer: the same byte size on every rank. `local` is this rank's bytes (a uint8 tensor: use
    `.view(dtype).reshape(shape)`); `peer(r)` is rank r's bytes."""

    def __init__(self, name: str, index: int, nbytes: int):
        self.name = name
        self.index = index
        self.nbytes = nbytes

    @property
    def local(self) -> torch.Tensor:
        raise NotImplementedError

    def peer(self, rank: int) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Window({self.name!r}, {self.nbytes} bytes)"


class Communicator(abc.ABC):
    """One rank's end of a job's communication. Collective methods must be called by every rank in the same
    order with matching shapes (PYPTO_COMM_CHECK=1 verifies it); collectives are not thread-safe, signals and
    one-sided ops are. Use as a context manager: leaving on an exception aborts (peers waiting on this rank fail
    promptly), leaving normally closes (an exit barrier)."""

    backend: str = "?"

    def __init__(self, rank: int, world_size: int):
        if not 0 <= rank < world_size:
            raise PyptoError(f"rank {rank} is outside world size {world_size}")
        self.rank = rank
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"<{type(self).__name__} backend={self.backend} rank={self.rank}/{self.world_size}>"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}")

    def _abort_at_exit(self):
        """Register an atexit hook that aborts this communicator if the process exits without close(): it ends
        while the interpreter is whole (peers' waits on it fail; the backend's resources are released, not left to
        teardown). The hook holds the communicator weakly; the backend unregisters it when it closes."""
        ref = weakref.ref(self)

        def hook() -> None:
            comm = ref()
            if comm is not None:
                comm.abort("the process exited without closing its communicator")
        atexit.register(hook)
        return hook

    # -- windows, signals, one-sided access (backends that can map peers' memory) --------------------------
    def _no_windows(self, op: str) -> NotSupportedError:
        return unsupported(self.backend, f"{op} (no shared windows)",
                           "windows, signals and one-sided ops need backend 'shm' (ranks on one host)")

    def alloc_window(self, nbytes: int, name: str | None = None, *, label: str | None = None) -> Window:
        """COLLECTIVE: a zeroed symmetric window of `nbytes` bytes on every rank."""
        raise self._no_windows("alloc_window")

    def notify(self, window: Window, peer: int, byte_offset: int, value: int, op="atomic_add") -> None:
        """Set, or atomically add `value` to, the int32 cell at `byte_offset` of `peer`'s part of `window`."""
        raise self._no_windows("notify")

    def wait(self, window: Window, byte_offset: int, expected: int, cmp="ge", *, label: str | None = None,
             cell: list | None = None, peers: list[int] | None = None) -> int:
        """Block until this rank's int32 cell at `byte_offset` compares `cmp` to `expected`; returns its value.
        `cell` (the caller's index) and `peers` (ranks that would set it) only make timeout reports clearer."""
        raise self._no_windows("wait")

    def remote_load(self, window: Window, peer: int, byte_offset: int, nbytes: int, dtype=torch.uint8,
                    shape=None) -> torch.Tensor:
        """A copy of `nbytes` bytes of `peer`'s part of `window` (viewed as dtype/shape when given)."""
        raise self._no_windows("remote_load")

    def remote_store(self, window: Window, peer: int, byte_offset: int, src: torch.Tensor,
                     atomic_add: bool = False) -> None:
        """Write (or atomically add) `src`'s elements into `peer`'s part of `window` at `byte_offset`."""
        raise self._no_windows("remote_store")

    def put(self, window: Window, peer: int, byte_offset: int, src: torch.Tensor, atomic_add: bool = False) -> None:
        """Bulk copy of a local tensor into `peer`'s window (remote_store of a whole tensor)."""
        raise self._no_windows("put")

    def get(self, window: Window, peer: int, byte_offset: int, dst: torch.Tensor) -> torch.Tensor:
        """Bulk copy from `peer`'s window into the local tensor `dst`; returns `dst`."""
        raise self._no_windows("get")

    # -- collectives ---------------------------------------------------------------------------------------
    @abc.abstractmethod
    def barrier(self, *, label: str | None = None) -> None: ...

    @abc.abstractmethod
    def allreduce(self, tensor: torch.Tensor, op="sum", *, label: str | None = None) -> torch.Tensor:
        """In place: every rank ends with the elementwise reduction over ranks (same bits on every rank)."""

    @abc.abstractmethod
    def allgather(self, out: torch.Tensor, inp: torch.Tensor, *, label: str | None = None) -> torch.Tensor:
        """out[r] = rank r's inp; out has shape (world_size, *inp.shape)."""

    @abc.abstractmethod
    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op="sum", *,
                       label: str | None = None) -> torch.Tensor:
        """out = reduction over ranks of chunk `rank` of inp (inp holds world_size chunks of out's size)."""

    @abc.abstractmethod
    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, *, label: str | None = None) -> torch.Tensor:
        """Chunk p of inp (equal chunks along dim 0) goes to rank p; out's chunk r comes from rank r."""

    @abc.abstractmethod
    def all_to_all_v(self, out: torch.Tensor, inp: torch.Tensor, send_counts, recv_counts, *,
                     label: str | None = None) -> torch.Tensor:
        """Rows along dim 0: the next send_counts[p] rows of inp go to rank p; recv_counts[r] rows from rank r
        land in out in rank order. Rows past sum(send_counts) / sum(recv_counts) are neither sent nor written."""

    @abc.abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int, *, label: str | None = None) -> torch.Tensor:
        """In place: every rank ends with rank src's tensor."""

    @abc.abstractmethod
    def close(self) -> None:
        """An exit barrier (with the wait deadline), then release: no rank leaves while a peer still reads."""

    @abc.abstractmethod
    def abort(self, reason: str = "") -> None:
        """Leave without the exit barrier, telling peers (if the backend can) so their waits fail promptly."""


# ---------------------------------------------------------------------------------------------------- arguments

def check_peer(comm: Communicator, peer: int, op: str) -> None:
    if not 0 <= int(peer) < comm.world_size:
        raise PyptoError(f"rank {comm.rank}: {op} to peer {peer}, outside world size {comm.world_size}")


def check_same(comm: Communicator, op: str, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise PyptoError(f"rank {comm.rank}: {op}: {what} dtypes differ ({a.dtype} vs {b.dtype})")


def check_allgather(comm: Communicator, out: torch.Tensor, inp: torch.Tensor) -> None:
    check_same(comm, "allgather", out, inp, "out and inp")
    if tuple(out.shape) != (comm.world_size, *inp.shape):
        raise PyptoError(f"rank {comm.rank}: allgather out has shape {tuple(out.shape)}, expected "
                         f"{(comm.world_size, *inp.shape)} (world size, then inp's shape)")


def check_reduce_scatter(comm: Communicator, out: torch.Tensor, inp: torch.Tensor) -> None:
    check_same(comm, "reduce_scatter", out, inp, "out and inp")
    if inp.numel() != comm.world_size * out.numel():
        raise PyptoError(f"rank {comm.rank}: reduce_scatter inp has {inp.numel()} elements, expected world size x "
                         f"out's = {comm.world_size * out.numel()}")


def check_all_to_all(comm: Communicator, out: torch.Tensor, inp: torch.Tensor) -> None:
    check_same(comm, "all_to_all", out, inp, "out and inp")
    if out.shape != inp.shape or inp.dim() == 0 or inp.shape[0] % comm.world_size:
        raise PyptoError(f"rank {comm.rank}: all_to_all needs out and inp of one shape whose dim 0 divides by the "
                         f"world size {comm.world_size}; got out {tuple(out.shape)}, inp {tuple(inp.shape)}")


def check_all_to_all_v(comm: Communicator, out: torch.Tensor, inp: torch.Tensor, send_counts,
                       recv_counts) -> tuple[list[int], list[int]]:
    check_same(comm, "all_to_all_v", out, inp, "out and inp")
    send, recv = [int(c) for c in send_counts], [int(c) for c in recv_counts]
    w = comm.world_size
    if len(send) != w or len(recv) != w or min(send + recv) < 0:
        raise PyptoError(f"rank {comm.rank}: all_to_all_v needs {w} non-negative send and recv counts; got "
                         f"send {send}, recv {recv}")
    if inp.dim() == 0 or out.shape[1:] != inp.shape[1:]:
        raise PyptoError(f"rank {comm.rank}: all_to_all_v rows of out {tuple(out.shape[1:])} and inp "
                         f"{tuple(inp.shape[1:])} differ")
    if send[comm.rank] != recv[comm.rank]:
        raise PyptoError(f"rank {comm.rank}: all_to_all_v sends {send[comm.rank]} rows to itself but expects "
                         f"{recv[comm.rank]} from itself")
    if sum(send) > inp.shape[0] or sum(recv) > out.shape[0]:
        raise PyptoError(f"rank {comm.rank}: all_to_all_v sends {sum(send)} rows from {inp.shape[0]} or receives "
                         f"{sum(recv)} rows into {out.shape[0]}")
    return send, recv


def check_src(comm: Communicator, src: int, op: str) -> int:
    if not 0 <= int(src) < comm.world_size:
        raise PyptoError(f"rank {comm.rank}: {op} from rank {src}, outside world size {comm.world_size}")
    return int(src)


def signature(name: str, tensor: torch.Tensor | None = None, shape=None, **extra) -> str:
    """What PYPTO_COMM_CHECK compares across ranks: op, shape, dtype and scalar arguments."""
    parts = []
    if tensor is not None:
        shape = tuple(tensor.shape) if shape is None else tuple(shape)
        parts.append(f"{shape} {str(tensor.dtype).replace('torch.', '')}")
    parts += [f"{k}={v}" for k, v in extra.items()]
    return f"{name}({', '.join(parts)})"
