"""The `pld` collectives (spec §4.10): in place on torch or window tensors, on the process communicator. Each declares
the tensor it writes (`writes=`), so a later region reading it waits for it; a `signal=` window, as the real
collectives take, is accepted and not needed. From plain Python (no kernel running) they run at once
(`run_plain`). The one-sided ops and signals are pypto_rt.ops.distributed's."""
from __future__ import annotations

from pypto_rt.collective import process
from pypto_rt.errors import OpError
from pypto_rt.language.enums import ReduceOp
from pypto_rt.ops import recording
from pypto_rt.ops.distributed import _tensor
from pypto_rt.ops.registry import op


def _reduce(op_) -> str:
    name = getattr(op_, "name", str(op_)).lower()
    if name not in ("sum", "max", "min"):
        raise OpError(f"pld collectives reduce with ReduceOp.Sum, Max or Min, got {op_!r}")
    return name


def _comm(name: str):
    recording.refuse(f"pld.{name} communicates with other ranks")
    return process.communicator(f"pld.{name}")


@op("pld.allreduce", writes="data")
def allreduce(data, signal=None, op=ReduceOp.Sum, **_hints):
    _comm("allreduce").allreduce(_tensor(data), _reduce(op), label=process.current_label())
    return data


@op("pld.allgather", writes="out")
def allgather(out, inp, signal=None, **_hints):
    _comm("allgather").allgather(_tensor(out), _tensor(inp), label=process.current_label())
    return out


@op("pld.reduce_scatter", writes="out")
def reduce_scatter(out, inp, signal=None, op=ReduceOp.Sum, **_hints):
    _comm("reduce_scatter").reduce_scatter(_tensor(out), _tensor(inp), _reduce(op), label=process.current_label())
    return out


@op("pld.all_to_all", writes="out")
def all_to_all(out, inp, signal=None, **_hints):
    _comm("all_to_all").all_to_all(_tensor(out), _tensor(inp), label=process.current_label())
    return out


@op("pld.all_to_all_v", writes="out")
def all_to_all_v(out, inp, send_counts, recv_counts, signal=None, **_hints):
    counts = [[int(c) for c in _tensor(x).reshape(-1).tolist()] if hasattr(_tensor(x), "tolist") else list(x)
              for x in (send_counts, recv_counts)]
    _comm("all_to_all_v").all_to_all_v(_tensor(out), _tensor(inp), counts[0], counts[1],
                                       label=process.current_label())
    return out


@op("pld.broadcast", writes="data")
def broadcast(data, signal=None, root=0, **_hints):
    _comm("broadcast").broadcast(_tensor(data), int(root), label=process.current_label())
    return data


@op("pld.barrier")
def barrier(signal=None, **_hints):
    _comm("barrier").barrier(label=process.current_label())


_PLAIN = {"pld.allreduce": allreduce, "pld.allgather": allgather, "pld.reduce_scatter": reduce_scatter,
          "pld.all_to_all": all_to_all, "pld.all_to_all_v": all_to_all_v, "pld.broadcast": broadcast,
          "pld.barrier": barrier}


def run_plain(qualname: str, args, kwargs):
    """A collective called from plain Python (no kernel running): on torch tensors, at once."""
    return _PLAIN[qualname](*args, **kwargs)
