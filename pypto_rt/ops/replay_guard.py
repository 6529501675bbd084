"""How ops talk to a run being recorded for replay (orchestration.torch_trace), if any.

Replaying a recorded run repeats its torch calls only. An op whose effect lies outside them (communication with
other ranks, printing) calls `refuse(reason)`: the run is then not replayed. `pl.read` asks `read_scalar` for an
integer the replay can read again itself (a `TracedInt`) instead of reading tensor data into Python, which would
fix the replay to the value seen when recording. Costs one list check when nothing records.
"""
from __future__ import annotations

from threading import get_ident

_recorders: list = []   # (thread, recorder) of the recordings active (one run records at a time, on one thread)


def push(recorder) -> None:
    _recorders.append((get_ident(), recorder))


def pop() -> None:
    _recorders.pop()


def _current():
    """The recorder of a run recorded on this thread (other threads' runs are not its business), or None."""
    if _recorders:
        thread, recorder = _recorders[-1]
        if thread == get_ident():
            return recorder
    return None


def refuse(reason: str) -> None:
    """The run now being recorded on this thread, if any, must not be replayed: `reason` says why."""
    recorder = _current()
    if recorder is not None:
        recorder.refuse(reason)


def recording() -> bool:
    return _current() is not None


def read_scalar(data, index: tuple):
    """The element of torch tensor `data` at `index` (ints, TracedInts) as a TracedInt the replay reads again, or
    None when no run is recorded on this thread or the recording cannot read it again (the caller then reads it
    as usual)."""
    recorder = _current()
    return recorder.read_scalar(data, index) if recorder is not None else None
