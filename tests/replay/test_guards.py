"""Guards: the checks a replay makes before it touches data, held as records in one normal form.

What users depend on: a course the run took is checked once however often the run asked (so replays stay short),
a check that holds for any data is not made at all, and a guard naming a value read from data the run computed
is recognised from the values it uses, not from its text."""
from __future__ import annotations

from pypto_rt.replay.guards import Guard, holds_always
from pypto_rt.replay.scalars import TracedInt


class Rec:
    active = True

    def guard(self, *args):
        pass


def value(v, code="s0"):
    return TracedInt(v, code, Rec())


def test_outcomes_and_sides_are_normalised_so_repeated_checks_are_equal():
    s = value(3)
    assert Guard.of(s, "<", 0, False) == Guard.of(0, "<=", s, True) == Guard("s0", ">=", "0", frozenset({"s0"}))
    assert Guard.of(s, "<", 0, False).line() == "if not (s0 >= 0): return _MISS"


def test_a_guard_knows_the_values_it_uses_from_the_numbers_not_their_text():
    s, t = value(3, "s0"), value(4, "s12")
    assert Guard.of(s + t, "<", 100, True).reads == frozenset({"s0", "s12"})
    assert Guard.of(s * 2, "==", 6, True).reads == frozenset({"s0"})


def test_a_check_that_holds_for_any_values_is_recognised():
    s = value(3)
    always = Guard.of((s + 1) * 8 - s * 8, "==", 8, True)
    assert holds_always(always, {"s0"})
    assert not holds_always(Guard.of(s + 1, "<=", 8, True), {"s0"})
    assert not holds_always(always, set()), "a float's arithmetic is not exact: it is always checked"
