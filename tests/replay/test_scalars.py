"""TracedInt: an integer read from data while a run is recorded, which a replay computes again.

What users depend on (through replay): arithmetic keeps the value's code, so offsets computed from data are
recomputed by every replay; everything that decides the run's course (a comparison, a truth test) or reads the
number as a plain value (int(), a list index, float arithmetic, formatting) becomes a guard the replay checks,
so a replay never silently reuses a number seen when recording. Once the recording ends it is a plain int.
"""
from __future__ import annotations

import pytest
import torch

from pypto_rt.language import dtypes as D
from pypto_rt.replay.scalars import (TracedFloat, TracedInt, arithmetic, code_of, compare, host_key, plain_key,
                                     smallest)
from pypto_rt.ops.value import TensorValue


class FakeRecorder:
    def __init__(self):
        self.active = True
        self.guards: list[tuple[str, bool]] = []
        self.refused = None

    def refuse(self, reason):
        self.refused = reason

    def guard(self, left, symbol, right, outcome):
        self.guards.append((f"{code_of(left)} {symbol} {code_of(right)}", outcome))


def traced(value=5, code="s0"):
    rec = FakeRecorder()
    return TracedInt(value, code, rec), rec


def test_arithmetic_keeps_code_and_value_without_guards():
    s, rec = traced(5)
    t = (s + 1) * 64 - 3 // s + (-s) % 7 + abs(s) + (2 << s)
    want = (5 + 1) * 64 - 3 // 5 + (-5) % 7 + 5 + (2 << 5)
    assert type(t) is TracedInt and t.code == "((((((s0 + 1) * 64) - (3 // s0)) + ((-s0) % 7)) + abs(s0)) + (2 << s0))"
    assert rec.guards == []
    assert t == want and rec.guards == [(f"{t.code} == {want}", True)], "only the comparison guards"
    q, r = divmod(s, 3)
    assert (q, r) == (1, 2) and type(q) is TracedInt and q.code == "(s0 // 3)" and r.code == "(s0 % 3)"


@pytest.mark.parametrize("use, guard", [
    (lambda s: s >= 0, ("s0 >= 0", True)),
    (lambda s: s < 2, ("s0 < 2", False)),
    (lambda s: bool(s), ("s0 != 0", True)),
    (lambda s: 7 == s, ("s0 == 7", False)),
    (lambda s: s > 1.5, ("s0 > 1.5", True)),
])
def test_comparisons_and_truth_tests_guard_their_outcome(use, guard):
    s, rec = traced(5)
    use(s)
    assert rec.guards == [guard]


@pytest.mark.parametrize("use, value", [
    (int, 5),
    (float, 5.0),
    (lambda s: [1, 2, 3, 4, 5, 6][plain_key(s)], 6),
    (lambda s: [0] * s, [0] * 5),
    (lambda s: f"{s:03d}", "005"),
    (lambda s: str(s), "5"),
    (lambda s: pow(s, 2, 3), 1),
])
def test_uses_as_a_plain_number_pin_the_value(use, value):
    s, rec = traced(5)
    assert use(s) == value
    assert ("s0 == 5", True) in rec.guards


def test_tensor_arithmetic_does_not_pin():
    s, rec = traced(5)
    assert torch.equal(torch.ones(2) * s, torch.full((2,), 5.0))
    assert rec.guards == []


def test_keys_for_plain_containers_are_pinned_and_tensor_keys_are_not():
    s, rec = traced(2)
    key = (slice(s, s + 1), 1)
    pinned = plain_key(key)
    assert pinned == (slice(2, 3), 1) and all(type(v) is int for v in (pinned[0].start, pinned[0].stop))
    assert ("s0 == 2", True) in rec.guards and ("(s0 + 1) == 3", True) in rec.guards
    rec.guards.clear()
    assert host_key(TensorValue(torch.zeros(4, 4), D.FP32), key) is key and rec.guards == []
    assert host_key([0, 1, 2], s) == 2 and rec.guards == [("s0 == 2", True)]


def test_after_the_recording_it_is_a_plain_int():
    s, rec = traced(5)
    rec.active = False
    assert type(s + 1) is int and s >= 0 and int(s) == 5 and [0] * s == [0] * 5
    assert rec.guards == []


def test_float_results_and_reads_stay_code():
    s, rec = traced(4)
    for value, code, want in ((s / 8, "(s0 / 8)", 0.5), (s + 0.5, "(s0 + 0.5)", 4.5),
                              (arithmetic("truediv", 1.0, s), "(1.0 / s0)", 0.25),
                              (arithmetic("mul", 1.5, s), "(1.5 * s0)", 6.0)):
        assert type(value) is TracedFloat and value.code == code and float.__eq__(value, want)
    assert rec.guards == []
    f = TracedFloat(0.25, "s1", rec)
    g = (1 - f) * s + f ** 2 - abs(-f) // 0.1
    assert type(g) is TracedFloat and g.code == "((((1 - s1) * s0) + (s1 ** 2)) - (abs((-s1)) // 0.1))"
    assert rec.guards == [] and float.__eq__(g, (1 - 0.25) * 4 + 0.25 ** 2 - 0.25 // 0.1)


def test_a_plain_float_on_the_left_still_guards_through_the_recorded_code_helpers():
    s, rec = traced(4)
    assert 1.5 * s == 6.0 and type(1.5 * s) is float, "Python's float reads it silently: why recorded runs route"
    assert rec.guards == []
    assert compare("lt", 0.5, s) and rec.guards == [("s0 > 0.5", True)]
    rec.guards.clear()
    assert smallest(0.5, s) == 0.5 and rec.guards == [("s0 < 0.5", False)]


def test_a_float_that_is_not_finite_cannot_be_pinned():
    rec = FakeRecorder()
    f = TracedFloat(float("inf"), "s0", rec)
    assert float(f) == float("inf") and rec.refused and rec.guards == []
    rec.refused = None
    assert f > 1.0 and rec.guards == [("s0 > 1.0", True)], "comparisons still guard"
