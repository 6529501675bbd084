"""The replayed call's fast path (replay.arguments, replay.entry `by_arguments`): a call like one replayed before
finds its recording from the caller's own arguments, without binding them.

What users depend on: whatever changes between two calls (a shape, dtype, stride or storage offset, which
arguments share memory, a scalar, a tensor's own metadata changed in place, a knob, the data's course) is seen
by the fast path exactly as binding would see it: the call gets its own recording or runs on the engine, and its
results are right.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config, run_stats
from pypto_rt.errors import InWriteWarning, KernelArgumentError
from pypto_rt.kernel_state import NOT_SETTLED
from pypto_rt.replay import entry as replay
from pypto_rt.replay import arguments
from pypto_rt.replay.arguments import ArgumentMatch
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import DISABLED, ENGINE, GUARD_MISS, REPLAYED

N = 8
POLICY = ReplayPolicy()
CALLS = POLICY.normal_runs + 1 + 1 + 2 * POLICY.trial_replays + 2   # past recording and the trial
KEEP = dict(slower=float("inf"))   # keep the recordings, whatever the timing says
GUARDED = arguments._TensorGuards is not None   # torch has its C tensor guards (else: the Python comparison)


@pl.jit
def scale(x: pl.Tensor[[N, N], pl.FP32], factor: pl.Scalar[pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        y[:, :] = pl.add(pl.mul(x, factor), 1.0)
    return y


@pl.jit
def pick_row(x: pl.Tensor[[N, N], pl.FP32], index: pl.Tensor[[1], pl.INT32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    row = pl.read(index, [0])
    if row < N // 2:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="low"):
            y[0:1, :] = pl.add(x[row : row + 1, :], 0.0)
    else:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="high"):
            y[0:1, :] = pl.add(x[row : row + 1, :], 100.0)
    return y


@pytest.fixture
def fast_calls(monkeypatch):
    """How many calls the fast path replayed (a list, appended to per call: True replayed there, False missed)."""
    seen = []
    real, real_settle = replay.by_arguments, replay.settle

    def spy(kernel, args):
        before = len(seen)
        result = real(kernel, args)
        if len(seen) == before:   # (not counted already by the settled call it installed)
            seen.append(result is not replay.MISS)
        return result

    def settle_spy(kernel, *made):   # the settled call, from `KernelFunction.__call__` without the driver
        settled = real_settle(kernel, *made)

        def spied(args):
            result = settled(args)
            if result is not NOT_SETTLED:
                seen.append(True)
            return result
        if kernel.state.settled is settled:
            kernel.state.settled = spied
        return spied
    monkeypatch.setattr(replay, "by_arguments", spy)
    monkeypatch.setattr(replay, "settle", settle_spy)   # (entry's name for replay.settled.settle)
    return seen


def decided(fn, *args):
    with run_stats.collect() as stats:
        fn(*args)
    return stats.replay.kind if stats.replay is not None else None


def warm(kernel=scale, x=None):
    x = torch.randn(N, N) if x is None else x
    with policy_scope(**KEEP):
        for _ in range(CALLS):
            kernel(x, 2.0, torch.empty(N, N))
    return x


def run_scale(x, factor=2.0, y=None):
    """(how the call ran, whether y is right)."""
    y = torch.empty(x.shape) if y is None else y
    with policy_scope(**KEEP):
        kind = decided(scale, x, factor, y)
    return kind, torch.equal(y, x * factor + 1.0)


def test_a_repeated_call_replays_on_the_fast_path(fast_calls):
    x = warm()
    fast_calls.clear()
    assert run_scale(x) == (REPLAYED, True) and fast_calls == [True]


@pytest.mark.parametrize("change", ["shape", "strides", "storage offset", "scalar", "scalar type"])
def test_a_changed_argument_is_not_replayed_by_the_recording_of_another(fast_calls, change):
    x = warm()
    fast_calls.clear()
    args = {"shape": (torch.randn(N + 1, N), 2.0, torch.empty(N + 1, N)),
            "strides": (torch.randn(N, N).t(),), "storage offset": (torch.randn(N * N + 3)[3:].view(N, N),),
            "scalar": (x, 3.0), "scalar type": (x, 2)}[change]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (an extent other than the annotation's warns)
        kind, right = run_scale(*args)
    # its own specialisation (run 1 before recording); an int for an FP32 scalar binds as the float recorded
    assert fast_calls == [False] and kind == (REPLAYED if change == "scalar type" else ENGINE) and right


def test_a_changed_dtype_is_refused_at_binding_as_on_a_first_call(fast_calls):
    x = warm()
    fast_calls.clear()
    with pytest.raises(KernelArgumentError, match="dtype"):
        scale(x.double(), 2.0, torch.empty(N, N))
    assert fast_calls == [False]


def test_tensors_sharing_memory_are_not_replayed_by_a_recording_of_separate_ones(fast_calls):
    warm()
    fast_calls.clear()
    x = torch.randn(N, N)
    y, expect = x.view(N, N), x * 2.0 + 1.0   # another tensor over the same memory: offsets and strides alike
    with policy_scope(**KEEP), warnings.catch_warnings():
        warnings.simplefilter("ignore", InWriteWarning)   # (y writes x's memory: it warns)
        kind = decided(scale, x, 2.0, y)
    assert fast_calls == [False] and kind == ENGINE and torch.equal(y, expect)


def test_metadata_changed_in_place_on_the_same_tensor_is_seen(fast_calls):
    x = warm()
    fast_calls.clear()
    expect = x.t() * 2.0 + 1.0
    x.t_()   # the same Python object, other strides
    kind, right = run_scale(x)
    assert fast_calls == [False] and kind == ENGINE and right
    assert torch.equal(x * 2.0 + 1.0, expect)


def test_knobs_changed_between_calls_take_effect_on_the_fast_path(fast_calls, monkeypatch, capsys):
    x = warm()
    monkeypatch.setenv("PYPTO_REPLAY", "0")
    assert run_scale(x) == (DISABLED, True)
    monkeypatch.delenv("PYPTO_REPLAY")
    assert run_scale(x) == (REPLAYED, True)
    monkeypatch.setenv("PYPTO_STATS", "1")
    assert run_scale(x) == (REPLAYED, True)
    assert "pypto-rt stats [scale]: replayed" in capsys.readouterr().err
    monkeypatch.delenv("PYPTO_STATS")
    with config.scope(REPLAY="0"):
        assert run_scale(x) == (DISABLED, True)
    with config.scope(EXECUTOR="reference"):
        assert run_scale(x) == (None, True)   # (the reference executor: replay not involved)
    with policy_scope(enabled=False):
        assert decided(scale, x, 2.0, torch.empty(N, N)) == DISABLED
    fast_calls.clear()
    assert run_scale(x) == (REPLAYED, True) and fast_calls == [True]


def test_a_settled_call_skips_the_trial_bookkeeping_until_the_policy_or_stats_change(fast_calls, monkeypatch,
                                                                                     capsys):
    """Past its trials a replayed call runs the chosen function untimed (replay.settled); a changed policy, or
    PYPTO_STATS=1, takes the full path again (what it decides or prints), then settles again."""
    x = warm()
    full, real = [], replay._replay
    monkeypatch.setattr(replay, "_replay", lambda *args, **kwargs: full.append(1) or real(*args, **kwargs))
    assert [run_scale(x) for _ in range(3)] == [(REPLAYED, True)] * 3 and full == []
    with policy_scope(**KEEP, misses=7):
        assert [decided(scale, x, 2.0, torch.empty(N, N)) for _ in range(3)] == [REPLAYED] * 3 and full == [1]
    with config.scope(STATS="1"):
        assert run_scale(x) == (REPLAYED, True) and len(full) == 2
    assert "pypto-rt stats [scale]: replayed" in capsys.readouterr().err
    assert run_scale(x) == (REPLAYED, True) and len(full) == 2 and fast_calls[-5:] == [True] * 5


def settle(kernel, *args):
    """Call `kernel` until its replay is settled (`KernelFunction.__call__` calls it without the driver): inside
    one policy scope, which the caller keeps open (a scope entered again is a change)."""
    for _ in range(CALLS + 1):
        kernel(*args)
    assert kernel.state.settled is not None


@pytest.mark.parametrize("change, expect", [
    (lambda: config.scope(REPLAY="0"), DISABLED), (lambda: config.scope(EXECUTOR="reference"), None),
    (lambda: policy_scope(enabled=False), DISABLED), (lambda: config.scope(STATS="1"), REPLAYED)],
    ids=["PYPTO_REPLAY=0", "reference executor", "policy scope", "PYPTO_STATS=1"])
def test_a_settled_call_is_left_when_a_knob_or_the_policy_changes(change, expect, capsys):
    x, y = torch.randn(N, N), torch.empty(N, N)
    with policy_scope(**KEEP):
        settle(scale, x, 2.0, y)
        capsys.readouterr()
        with change():
            y.zero_()
            assert decided(scale, x, 2.0, y) == expect and torch.equal(y, x * 2.0 + 1.0)
        printed = capsys.readouterr().err
        assert ("pypto-rt stats [scale]: replayed" in printed) == (expect == REPLAYED)
        assert [decided(scale, x, 2.0, y) for _ in range(2)] == [REPLAYED] * 2   # (the full path once, then
        assert scale.state.settled is not None                                  # settled again)


def test_a_settled_call_whose_replay_was_dropped_on_the_bound_way_runs_on_the_engine():
    """Guard misses of calls that bind (keyword arguments) drop the replay; the positional call settled before
    must not run it."""
    x, low = torch.randn(N, N), torch.tensor([1], dtype=torch.int32)
    y = torch.empty(1, N)
    with policy_scope(**KEEP, misses=1):
        settle(pick_row, x, low, y)
        high, spec = torch.tensor([N - 1], dtype=torch.int32), next(iter(pick_row.state.replay.values()))
        for _ in range(4 * CALLS):
            assert decided(lambda: pick_row(x=x, index=high, y=y)) == GUARD_MISS
            if spec.replay is None:   # (dropped: the next call records again, with the blocks called as they are)
                break
        assert spec.replay is None and torch.equal(y, x[N - 1:] + 100.0)
        assert decided(pick_row, x, low, y) != REPLAYED and torch.equal(y, x[1:2])


def test_a_guard_miss_on_the_fast_path_runs_on_the_engine(fast_calls):
    x = torch.randn(N, N)

    def check(row):
        y = torch.empty(1, N)
        with policy_scope(**KEEP):
            kind = decided(pick_row, x, torch.tensor([row], dtype=torch.int32), y)
        assert torch.equal(y, x[row:row + 1] + (0.0 if row < N // 2 else 100.0)), row
        return kind

    assert [check(1) for _ in range(CALLS)][-1] == REPLAYED
    fast_calls.clear()
    assert check(2) == REPLAYED and fast_calls == [True]   # another row, the same course: replayed, read again
    fast_calls.clear()
    assert check(N - 1) == GUARD_MISS and fast_calls == [False]   # the `if` goes the other way


@pl.program
class Scaler:
    """A program whose instances compare equal to anything: a match must still tell its `self`s apart."""
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__

    @pl.function(type=pl.FunctionType.Opaque)
    def scale(self, x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            y[:, :] = pl.add(pl.mul(x, 2.0), 1.0)
        return y


def test_a_program_method_replays_on_the_fast_path_for_its_own_self_only(fast_calls):
    """A `@pl.program` method (conformance c05) takes the fast path; its `self` is matched by identity, as the
    specialisation key has it: another instance gets its own recording."""
    first, second = Scaler(), Scaler()
    x = torch.randn(N, N)

    def run(program):
        y = torch.empty(N, N)
        with policy_scope(**KEEP):
            kind = decided(program.scale, x, y)
        return kind, torch.equal(y, x * 2.0 + 1.0)
    for _ in range(CALLS):
        run(first)
    fast_calls.clear()
    assert run(first) == (REPLAYED, True) and fast_calls == [True]
    fast_calls.clear()
    assert run(second)[1] and fast_calls == [False]


def _variants():
    base = torch.randn(N, N)
    shared = torch.randn(3 * N, N)
    program, other_program = Scaler(), Scaler()
    return {
        "program": (program, base, torch.empty(N, N)),
        "other program": (other_program, base, torch.empty(N, N)),
        "base": (base, 2.0, torch.empty(N, N)),
        "other data": (torch.randn(N, N), 2.0, torch.empty(N, N)),
        "transposed": (torch.randn(N, N).t(), 2.0, torch.empty(N, N)),
        "offset": (shared[N:2 * N], 2.0, torch.empty(N, N)),
        "sharing": (shared[:N], 2.0, shared[2 * N:]),
        "aliased": (base, 2.0, base.view(N, N)),
        "float64": (base.double(), 2.0, torch.empty(N, N)),
        "int scalar": (base, 2, torch.empty(N, N)),
        "other scalar": (base, 3.0, torch.empty(N, N)),
        "wider": (torch.randn(N, N + 1), 2.0, torch.empty(N, N)),
        "rank 1": (torch.randn(N * N), 2.0, torch.empty(N, N)),
        "fewer": (base, 2.0),
        "meta": (torch.empty(N, N, device="meta"), 2.0, torch.empty(N, N)),
    }


def _key(args):
    try:
        return replay._key(args)
    except (RuntimeError, NotImplementedError):
        return None


@pytest.mark.parametrize("made", sorted(_variants()))
def test_a_match_holds_only_where_the_specialisation_key_is_equal(made):
    variants = _variants()
    match = ArgumentMatch.of(variants[made])
    if made == "meta":
        assert match is None or not match.matches(variants[made])
        return
    for name, args in variants.items():
        try:
            matched = match.matches(args)
        except (RuntimeError, NotImplementedError):
            matched = False
        same = _key(args) is not None and _key(args) == _key(variants[made])
        assert matched == same, (made, name)


def test_a_tensor_that_requires_grad_goes_the_bound_way_and_stays_right(fast_calls):
    x = warm()
    fast_calls.clear()
    kind, right = run_scale(x.clone().requires_grad_())
    # torch's guard is stricter than the key (bound, then replayed); the Python comparison is the key's
    assert fast_calls == [not GUARDED] and kind == REPLAYED and right


def test_a_call_in_inference_mode_goes_the_bound_way_once_then_the_fast_path(fast_calls):
    x = warm()
    with torch.inference_mode():
        fast_calls.clear()
        kinds = [run_scale(x) for _ in range(3)]
    # torch's guard also checks the dispatch mode: a new match is made for it (the first call binds, and replays)
    assert kinds == [(REPLAYED, True)] * 3 and fast_calls == [not GUARDED, True, True]


def test_specialisations_called_in_turn_all_take_the_fast_path(fast_calls):
    """A serving loop's batch buckets: each layout keeps its own recording, and calls alternating between them
    all find theirs without binding."""
    layouts = [torch.randn(N, N), torch.randn(N, N).t(), torch.randn(N * N + 5)[5:].view(N, N)]
    for x in layouts:
        warm(x=x)
    fast_calls.clear()
    kinds = [run_scale(layouts[i % 3]) for i in range(9)]
    assert kinds == [(REPLAYED, True)] * 9 and fast_calls == [True] * 9
    assert len(scale.state.replay_by_arguments) >= 3


def test_calls_alternating_between_two_settled_specialisations_stay_on_the_settled_path(monkeypatch):
    """A kernel called on each layer's slice of a stacked pool (another storage offset each: two specialisations)
    keeps both settled (replay.settled's chain): after both settled, no call goes back to the driver, and each
    writes its own slice."""
    pool, y = torch.randn(2 * N, N), torch.empty(N, N)
    slices = (pool[:N], pool[N:])
    with policy_scope(**KEEP):
        for x in slices:
            settle(scale, x, 2.0, y)
        driver = []
        real = replay.by_arguments
        monkeypatch.setattr(replay, "by_arguments", lambda *args: driver.append(1) or real(*args))
        for _ in range(3):
            for x in slices:
                y.zero_()
                scale(x, 2.0, y)
                assert torch.equal(y, x * 2.0 + 1.0)
        assert driver == []
