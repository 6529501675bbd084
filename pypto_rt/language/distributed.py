"""The `pld` surface (`import pypto.language.distributed as pld`): windows, signals, collectives.

Importable everywhere. `world_size()` / `rank()` answer in plain Python (1 and 0 outside
`pypto-launch`); everything that moves bytes between ranks belongs to the multi-rank
runtime and says so when called before it exists.
"""
from __future__ import annotations

import os
from dataclasses import replace

from pypto_rt.errors import DSLError, NotSupportedError, user_span
from pypto_rt.language.enums import NotifyOp, ReduceOp, WaitCmp
from pypto_rt.language.types import TensorType, _shape_dtype

__all__ = ["DistributedTensor", "alloc_window_buffer", "window", "world_size", "rank", "nranks", "get_comm_ctx",
           "NotifyOp", "WaitCmp", "ReduceOp", "system", "tensor", "tile", "allreduce", "allgather",
           "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "barrier"]


class _DistMeta(type):
    def __getitem__(cls, item) -> TensorType:
        shape, dtype, layout = _shape_dtype(item, "pld.DistributedTensor")
        return replace(TensorType(shape, dtype, layout), direction="window")


class DistributedTensor(metaclass=_DistMeta):
    """`pld.DistributedTensor[[...], dtype]`: a window tensor shared with peers (implicitly InOut)."""


def _multi_rank(name: str):
    def fail(*args, **kwargs):
        raise NotSupportedError(f"not supported yet: pld.{name} (it needs the multi-rank runtime)", user_span(2),
                                "run single-rank kernels for now")
    fail.__name__ = name
    fail.__doc__ = f"`pld.{name}`: part of the multi-rank runtime."
    return fail


def world_size() -> int:
    """Ranks in this job: WORLD_SIZE under pypto-launch, 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1")) if os.environ.get("PYPTO_LAUNCHED") == "1" else 1


def rank(ctx=None) -> int:
    """This process's rank (0 outside pypto-launch); with a comm context, the rank inside its domain."""
    if ctx is not None:
        raise NotSupportedError("not supported yet: pld.rank(ctx) (it needs the multi-rank runtime)", user_span(2))
    return int(os.environ.get("RANK", "0")) if os.environ.get("PYPTO_LAUNCHED") == "1" else 0


class _Namespace:
    def __init__(self, name: str, members: tuple[str, ...]):
        self._name = name
        for m in members:
            setattr(self, m, _multi_rank(f"{name}.{m}"))

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        raise DSLError(f"unknown op pld.{self._name}.{item}", user_span(2))


system = _Namespace("system", ("notify", "wait", "barrier"))
tensor = _Namespace("tensor", ("put", "get", "remote_store", "allreduce", "allgather"))
tile = _Namespace("tile", ("remote_load", "remote_store"))
alloc_window_buffer = _multi_rank("alloc_window_buffer")
window = _multi_rank("window")
nranks = _multi_rank("nranks")
get_comm_ctx = _multi_rank("get_comm_ctx")
allreduce = _multi_rank("allreduce")
allgather = _multi_rank("allgather")
reduce_scatter = _multi_rank("reduce_scatter")
all_to_all = _multi_rank("all_to_all")
all_to_all_v = _multi_rank("all_to_all_v")
broadcast = _multi_rank("broadcast")
barrier = _multi_rank("barrier")
