"""The `pld` surface (`import pypto.language.distributed as pld`): windows, signals, one-sided ops, collectives.

Two halves:
- plain calls (`world_size`, `rank`, `alloc_window_buffer`, `window`, `get_comm_ctx`, `nranks`) run wherever
  spec §4.10's table allows: in plain Python of a `pypto-launch`ed rank, in a `@pl.jit.host` program, in
  kernels. Outside a launcher `world_size()` is 1 and `rank()` 0;
- ops (`pld.system.notify/wait`, `pld.tile.remote_load/remote_store`, `pld.tensor.put/get/remote_store`, the
  collectives) are op stubs like `pl.add`: kernels run them through their executor on the op library
  (pypto_rt/ops/distributed.py), and the compiled runtime orders them per comm domain in program order.
  The collectives also run in plain Python of a launched rank, on torch tensors.
"""
from __future__ import annotations

import math
from dataclasses import replace

from pypto_rt.errors import DSLError, PyptoError, user_span
from pypto_rt.language import _runtime
from pypto_rt.language.dtypes import DataType
from pypto_rt.language.enums import NotifyOp, ReduceOp, WaitCmp
from pypto_rt.language.ops import Namespace, OpStub
from pypto_rt.language.types import TensorType, _shape_dtype

__all__ = ["DistributedTensor", "alloc_window_buffer", "window", "world_size", "rank", "nranks", "get_comm_ctx",
           "CommContext", "NotifyOp", "WaitCmp", "ReduceOp", "system", "tensor", "tile", "allreduce", "allgather",
           "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "barrier"]


class _DistMeta(type):
    def __getitem__(cls, item) -> TensorType:
        shape, dtype, layout = _shape_dtype(item, "pld.DistributedTensor")
        return replace(TensorType(shape, dtype, layout), direction="window")


class DistributedTensor(metaclass=_DistMeta):
    """`pld.DistributedTensor[[...], dtype]`: a window tensor shared with peers (implicitly InOut)."""


class CommContext:
    """What `pld.get_comm_ctx(t)` returns: the comm domain of a window tensor (here: the whole job)."""
    __slots__ = ("rank", "nranks")

    def __init__(self, rank: int, nranks: int):
        self.rank, self.nranks = rank, nranks

    def __repr__(self) -> str:
        return f"<comm ctx rank {self.rank} of {self.nranks}>"


def _process():
    from pypto_rt.collective import process
    return process


def world_size() -> int:
    """Ranks in this job: the host form's device count, WORLD_SIZE under pypto-launch, 1 otherwise."""
    return _process().world_size()


def rank(ctx: CommContext | None = None) -> int:
    """This process's rank (0 outside pypto-launch); with a comm context, the rank inside its domain."""
    if ctx is None:
        return _process().rank()
    if not isinstance(ctx, CommContext):
        raise DSLError(f"pld.rank(ctx) takes what pld.get_comm_ctx returns, got {type(ctx).__name__}", user_span(2))
    return ctx.rank


def nranks(ctx: CommContext) -> int:
    """The rank count of a comm context's domain."""
    if not isinstance(ctx, CommContext):
        raise DSLError(f"pld.nranks(ctx) takes what pld.get_comm_ctx returns, got {type(ctx).__name__}",
                       user_span(2))
    return ctx.nranks


def get_comm_ctx(t) -> CommContext:
    """The comm context of a window tensor (a `pld.DistributedTensor` parameter or a `pld.window` view)."""
    data = getattr(t, "data", t)
    process = _process()
    found = process.window_of(data) if hasattr(data, "untyped_storage") else None
    if found is None:
        raise PyptoError(f"pld.get_comm_ctx: {t!r} is not a window tensor", user_span(2),
                         "pass a pld.DistributedTensor parameter bound to a pld.window(...) view")
    comm = found[0].comm
    return CommContext(comm.rank, comm.world_size)


def alloc_window_buffer(shape_or_nbytes, dtype: DataType | None = None):
    """COLLECTIVE (every rank, same order): a zeroed symmetric window buffer, of `nbytes` bytes or of a
    [shape] of `dtype`, zeroed before any peer can signal into it."""
    if isinstance(shape_or_nbytes, int):
        nbytes = shape_or_nbytes
    elif isinstance(shape_or_nbytes, (list, tuple)) and isinstance(dtype, DataType):
        nbytes = math.prod(int(d) for d in shape_or_nbytes) * dtype.get_byte()
    else:
        raise DSLError(f"pld.alloc_window_buffer takes a byte count or (shape, dtype=pl.<dtype>), got "
                       f"{shape_or_nbytes!r}, dtype={dtype!r}", user_span(2))
    if nbytes <= 0:
        raise DSLError(f"pld.alloc_window_buffer: {nbytes} bytes; a window needs at least one", user_span(2))
    return _process().alloc(nbytes)


def window(buf, shape, dtype: DataType):
    """A typed [shape] view of a window buffer (a torch tensor to pass as a `pld.DistributedTensor` argument)."""
    from pypto_rt.ops.dtype_rules import storage_dtype   # the one dtype -> torch storage mapping
    process = _process()
    if not isinstance(buf, (process.WindowBuffer, process.HostWindowBuffer)):
        raise DSLError(f"pld.window takes what pld.alloc_window_buffer returns, got {type(buf).__name__}",
                       user_span(2))
    nbytes = math.prod(int(d) for d in shape) * dtype.get_byte()
    if nbytes > buf.nbytes:
        raise DSLError(f"pld.window: {list(shape)} of {dtype!r} needs {nbytes} bytes, the buffer has {buf.nbytes}",
                       user_span(2), "allocate the buffer with the same shape and dtype")
    if isinstance(buf, process.HostWindowBuffer):   # a host-form program: each rank binds its own view
        return process.HostWindowView(buf, shape, dtype)
    return buf.window.local[:nbytes].view(storage_dtype(dtype)).view([int(d) for d in shape])


class _CollectiveStub(OpStub):
    # A collective: an op inside kernels; in plain Python of a launched rank it runs at once on torch tensors.
    # (A comment: each stub's __doc__ is its op's own doc, see OpStub.)
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        if _runtime.active() is not None:
            return super().__call__(*args, **kwargs)
        from pypto_rt.ops.collectives import run_plain   # plain Python: no executor to dispatch through
        return run_plain(self.qualname, args, kwargs)


system = Namespace("pld.system", {"notify", "wait"})
tensor = Namespace("pld.tensor", {"put", "get", "remote_store"})
tile = Namespace("pld.tile", {"remote_load", "remote_store"})
allreduce = _CollectiveStub("pld.allreduce")
allgather = _CollectiveStub("pld.allgather")
reduce_scatter = _CollectiveStub("pld.reduce_scatter")
all_to_all = _CollectiveStub("pld.all_to_all")
all_to_all_v = _CollectiveStub("pld.all_to_all_v")
broadcast = _CollectiveStub("pld.broadcast")
barrier = _CollectiveStub("pld.barrier")
