"""What ops note about tensors (`recording.notes()`) belongs to the run that noted it: a recording sees only its own
notes (kept across its own pushes), nothing noted there is seen outside it or on another thread, and a write since
the note voids it. A select over a comparison made outside the recording derives its mask from the data."""
import threading

import torch

from pypto_rt.language import dtypes as D
from pypto_rt.ops import comparison as C
from pypto_rt.ops import index_range, recording
from pypto_rt.ops.value import TensorValue


class _Recorder:
    """A recording that refuses nothing and holds no tensor fixed."""

    def fixed(self, t) -> bool:
        return False

    def refuse(self, reason):
        raise AssertionError(reason)


class _Calls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _recorded(recorder, fn):
    recording.push(recorder)
    try:
        return fn()
    finally:
        recording.pop()


def test_a_proof_stays_in_the_recording_that_noted_it():
    lanes, first, second = torch.zeros(4, dtype=torch.int32), _Recorder(), _Recorder()
    _recorded(first, lambda: index_range.note(lanes, 4, index_range.ALL))
    assert _recorded(first, lambda: index_range.bound_of(lanes)) == 4          # its own, across pushes
    assert _recorded(second, lambda: index_range.bound_of(lanes)) is None      # another recording's replay
    assert index_range.bound_of(lanes) is None                                  # outside any recording
    index_range.note(lanes, 4, index_range.ALL)                                 # noted outside: not inside
    assert index_range.bound_of(lanes) == 4 and _recorded(second, lambda: index_range.bound_of(lanes)) is None
    lanes += 1
    assert index_range.bound_of(lanes) is None and _recorded(first, lambda: index_range.bound_of(lanes)) is None


def test_notes_do_not_cross_threads():
    lanes, seen = torch.zeros(4, dtype=torch.int32), []
    index_range.note(lanes, 4, index_range.ALL)
    worker = threading.Thread(target=lambda: seen.append(index_range.bound_of(lanes)))
    worker.start()
    worker.join(timeout=10)
    assert seen == [None] and index_range.bound_of(lanes) == 4


def test_a_select_uses_the_comparison_noted_in_its_own_run_only():
    a = TensorValue(torch.tensor([1.0, -2.0, 3.0]), D.FP32)
    x, y = TensorValue(torch.ones(3), D.FP32), TensorValue(torch.zeros(3), D.FP32)
    outside = C.cmps(a, 0.0, "gt")                       # made before the recording: an entry to its replay

    def select(mask):
        with _Calls() as calls:
            out = C.sel(mask, x, y)
        return out.data.tolist(), calls.names

    got, calls = select(outside)                        # (the same run: the noted comparison, no `!= 0` pass)
    assert got == [1.0, 0.0, 1.0] and "ne" not in calls, calls
    got, calls = _recorded(_Recorder(), lambda: select(outside))
    assert got == [1.0, 0.0, 1.0] and "ne" in calls, calls
    got, calls = _recorded(_Recorder(), lambda: select(C.cmps(a, 0.0, "gt")))
    assert got == [1.0, 0.0, 1.0] and "ne" not in calls, calls
