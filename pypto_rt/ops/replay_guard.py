"""How ops talk to a run being recorded for replay (orchestration.torch_trace), if any.

Replaying a recorded run repeats its torch calls only. An op whose effect lies outside them (communication with
other ranks, printing) calls `refuse(reason)`: the run is then not replayed. `pl.read` asks `read_scalar` for an
integer the replay can read again itself (a `TracedInt`) instead of reading tensor data into Python, which would
fix the replay to the value seen when recording. Costs one thread-local read when nothing records.
"""
from __future__ import annotations

import threading


class _Recording(threading.local):
    recorder = None   # the recorder of the run or block recorded on this thread (others' are not its business)


_this_thread = _Recording()


def push(recorder) -> None:
    """`recorder` records on this thread (a run on the host, or one block of a kernel on a worker)."""
    if _this_thread.recorder is not None:
        raise RuntimeError("a recording is already active on this thread")
    _this_thread.recorder = recorder


def pop() -> None:
    _this_thread.recorder = None


def _current():
    return _this_thread.recorder


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
