"""How ops talk to a run being recorded for replay (orchestration.torch_trace), if any.

Replaying a recorded run repeats its torch calls only. An op whose effect lies outside them (communication with
other ranks, printing) calls `refuse(reason)`: the run is then not replayed. `pl.read` asks `read_scalar` for an
integer the replay can read again itself (a `TracedInt`) instead of reading tensor data into Python, which would
fix the replay to the value seen when recording. Costs one list check when nothing records.
"""
from __future__ import annotations

_recorders: list = []   # the recorders active on the recording thread (one run records at a time)


def push(recorder) -> None:
    _recorders.append(recorder)


def pop() -> None:
    _recorders.pop()


def refuse(reason: str) -> None:
    """The run now being recorded, if any, must not be replayed: `reason` says why."""
    if _recorders:
        _recorders[-1].refuse(reason)


def recording() -> bool:
    return bool(_recorders)


def read_scalar(data, index: tuple):
    """The element of torch tensor `data` at `index` (ints, TracedInts) as a TracedInt the replay reads again, or
    None when no run is recorded or the recording cannot read it again (the caller then reads it as usual)."""
    return _recorders[-1].read_scalar(data, index) if _recorders else None
