"""How ops talk to a run being recorded for replay (pypto_rt.replay), if any: the op library's whole view of it.

Replaying a recorded run repeats its torch calls only. An op whose effect lies outside them (communication with
other ranks, printing) calls `refuse(reason)`: the run is then not replayed; the signal and store ops go through
`communicate`, which the recorder of a signalling block records as calls of their effects. `pl.read` asks
`read_scalar` for a number the replay can read again itself instead of reading tensor data into Python, which would
fix the replay to the value seen when recording. Such numbers are `ScalarFromData`s (replay's traced ints and floats
subclass it): ops take them as they are where an int or float goes, so their code reaches torch. The recorder is
whatever object the replay layer pushed on this thread; ops never import replay. Costs one thread-local read when
nothing records.

`notes()` is where ops leave facts about tensors they made for later ops (`TensorNotes`: a comparison's bool
result for the select over it, index lanes proven in range): those of the run being recorded on this thread, or,
with nothing recorded, this thread's own. A fact never crosses from one recording to another, into a recording
from outside, or out of one: a replay reads its entry tensors afresh, so only facts about tensors the recorded
run itself computed hold for every replay.
"""
from __future__ import annotations

import contextlib
import threading
import weakref


class ScalarFromData:
    """Marker base of a number read from tensor data while recording (an int or float subclass that remembers
    how the replay computes it). Plain `isinstance` checks: no ABC machinery on the ops' hot paths."""
    __slots__ = ()


class TensorNotes:
    """Facts about tensors, each under a kind (`note(t, kind, fact)`, `fact(t, kind)`): a fact is about tensor `t`
    itself (a view of it is another tensor) and holds while `t` lives and is not written since the note (its
    version counter, which its views share: a write through any of them voids it). Dead tensors' facts go with
    them."""

    def __init__(self):
        self._facts: dict[tuple, tuple] = {}   # (id(t), kind) -> (weakref to t, its version when noted, fact)

    def note(self, t, kind: str, fact) -> None:
        if t.is_inference():
            return      # (an inference tensor keeps no version counter)
        key, facts = (id(t), kind), self._facts
        facts[key] = (weakref.ref(t, lambda _ref: facts.pop(key, None)), t._version, fact)

    def fact(self, t, kind: str):
        """The fact noted for `t` under `kind`, or None (none noted, or `t` written since)."""
        entry = self._facts.get((id(t), kind))
        if entry is None or entry[0]() is not t or entry[1] != t._version:
            return None
        return entry[2]


class _Recording(threading.local):
    recorder = None   # the recorder of the run or block recorded on this thread (others' are not its business)
    notes = None      # that recording's TensorNotes while it records here
    own_notes = None  # this thread's TensorNotes for what runs with nothing recorded


_this_thread = _Recording()
_notes_of = weakref.WeakKeyDictionary()   # recorder -> its TensorNotes (kept across its pushes, dropped with it)


def push(recorder) -> None:
    """`recorder` records on this thread (a run on the host, or one block of a kernel on a worker); it has
    `refuse(reason)` and `read_scalar(data, index)`."""
    if _this_thread.recorder is not None:
        raise RuntimeError("a recording is already active on this thread")
    _this_thread.recorder = recorder
    notes = _notes_of.get(recorder)
    _this_thread.notes = notes if notes is not None else _notes_of.setdefault(recorder, TensorNotes())


def pop() -> None:
    _this_thread.recorder = _this_thread.notes = None


def notes() -> TensorNotes:
    """The facts of the run recorded on this thread, or this thread's own when nothing records (see the module
    docstring)."""
    current = _this_thread.notes
    if current is None:
        current = _this_thread.own_notes
        if current is None:
            current = _this_thread.own_notes = TensorNotes()
    return current


def refuse(reason: str) -> None:
    """The run now being recorded on this thread, if any, must not be replayed: `reason` says why."""
    recorder = _this_thread.recorder
    if recorder is not None:
        recorder.refuse(reason)


def communicate(reason: str, effect, args: tuple):
    """A `pld` op's effect outside torch, `effect(*args)` on its operands (window tensors, peer, offsets, values).
    A run recorded on this thread records it as one call where it can (a signalling block: replay.comm_block) and
    refuses with `reason` elsewhere."""
    recorder = _this_thread.recorder
    if recorder is None:
        return effect(*args)
    take = getattr(recorder, "communicate", None)
    if take is None:
        recorder.refuse(reason)
        return effect(*args)
    return take(reason, effect, args)


def recording() -> bool:
    return _this_thread.recorder is not None


def current():
    """The recorder of the run recorded on this thread, or None (orchestration hands it a communication task's
    blocks to record as opaque calls: the op library itself never needs it)."""
    return _this_thread.recorder


def fixed(data) -> bool:
    """Whether a run is recorded on this thread and every replay of it computes torch tensor `data` from constants
    only, to the contents it holds now: an op may then check or resolve it once, now, under `unrecorded()`,
    instead of recording that work for every replay."""
    recorder = _this_thread.recorder
    take = getattr(recorder, "fixed", None)
    return take is not None and take(data)


@contextlib.contextmanager
def unrecorded():
    """A context in which this thread's torch calls are not recorded (for work on `fixed` data)."""
    recorder = _this_thread.recorder
    was = recorder.mute(True)
    try:
        yield
    finally:
        recorder.mute(was)


def read_scalar(data, index: tuple):
    """The element of torch tensor `data` at `index` (ints, traced ints) as a ScalarFromData the replay reads
    again, or None when no run is recorded on this thread or the recording cannot read it again (the caller then
    reads it as usual)."""
    recorder = _this_thread.recorder
    return recorder.read_scalar(data, index) if recorder is not None else None


def is_int(value) -> bool:
    """An integer ops take as it is: a plain int, or one read from data (it keeps its code)."""
    return type(value) is int or (isinstance(value, ScalarFromData) and isinstance(value, int))


def integral(value):
    """An index or offset as ops take it: an int, one read from data as it is, anything else via int()."""
    return value if is_int(value) else int(value)


def less(left, right) -> bool:
    """`left < right`; a plain float against a number read from data asks that number (its mirrored method):
    float's own method would read an int subclass as a plain int without asking."""
    if type(left) is float and isinstance(right, ScalarFromData):
        return right > left
    return left < right
