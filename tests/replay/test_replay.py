"""Replay: an entry call whose course depends only on shapes, dtypes and scalars runs again as recorded torch calls.

What users depend on: a replayed call gives bit-for-bit the engine's outputs on new data; integers read from data
(`pl.read`) are read again by every replay, and a call whose data takes another course than recorded (an `if`
on such a value, a loop bound, a Python list index) runs on the engine instead, so it stays right when that
data changes; data read into Python any other way is never replayed; a new shape, stride, aliasing or scalar
value gets its own recording; PYPTO_REPLAY=0 turns it off.
"""
from __future__ import annotations

import math
import os
import re

import pytest
import torch

import pypto.language as pl
from pypto_rt import config, run_stats
from pypto_rt.errors import InWriteWarning
from pypto_rt.replay import entry as replay
from pypto_rt.replay.capture import Recorder
from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import DISABLED, ENGINE, GUARD_MISS, RECORDED, REFUSED, REPLAYED
from tests.orchestration import conformance_cases

KERNELS = conformance_cases.KERNELS
POLICY = ReplayPolicy()   # the declared limits
# engine runs, recording, warm-up replay, the trial (replays alternating with engine runs), a few more
CALLS = POLICY.normal_runs + 1 + 1 + 2 * POLICY.trial_replays + 2
TIMES_REPLAYED = CALLS - POLICY.normal_runs - 1 - POLICY.trial_replays   # how many of them replay
KEEP = dict(slower=float("inf"))   # keep the recordings, whatever the timing says


def decided(fn, *args):
    """Call `fn(*args)`; how it ran (its run_stats.ReplayDecision)."""
    with run_stats.collect() as stats:
        fn(*args)
    return stats.replay


def guards(decision) -> int:
    """The number of guards a replay checks, as its decision states it (0 when it states none)."""
    found = re.search(r"(\d+) guards", decision.reason)
    return int(found.group(1)) if found else 0


def call(entry, specs, values, **knobs):
    values = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    with config.scope(**knobs):
        entry(*[values[s.name] for s in specs])
    return values


@pytest.mark.parametrize("name", KERNELS)
def test_replayed_calls_match_the_engine_bit_for_bit_on_new_data(name):
    # keep every recording, whatever the timing says, so each replayable kernel is compared as a replay
    entry, specs, outputs = conformance_cases.load(name, "replay")
    with policy_scope(slower=float("inf"), parallel=float("inf")):
        for seed in range(CALLS):
            inputs = conformance_cases.fresh_inputs(specs, seed)
            with run_stats.collect() as stats:
                got = call(entry, specs, inputs)
            want = call(entry, specs, inputs, REPLAY="0")
            for out in outputs:
                assert torch.equal(got[out], want[out]), f"{name}: call {seed}: output {out} differs from the engine's"
    assert stats.replay.kind == REPLAYED, stats.replay
    assert len(replay.decisions(getattr(entry, "kernel", entry))) == 1
    if name.startswith("c06"):   # host pl.reads steer an `if` and place each write: read again, guarded
        assert guards(stats.replay) > 0, stats.replay


ROWS, COLS = 16, 8


@pl.jit
def gather_row(src: pl.Tensor[[ROWS, COLS], pl.FP32], index: pl.Tensor[[1], pl.INT32],
               out: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
    row = pl.read(index, [0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_row"):
        out[0:1, :] = pl.mul(src[row : row + 1, :], 2.0)
    return out


def test_a_host_read_offset_is_read_again_by_every_replay():
    src = torch.randn(ROWS, COLS)
    for i in range(CALLS):
        row = (3 * i + 1) % ROWS
        out = torch.zeros(1, COLS)
        decision = decided(gather_row, src, torch.tensor([row], dtype=torch.int32), out)
        assert torch.equal(out, src[row : row + 1] * 2.0), f"call {i} read row {row}"
    assert decision.kind == REPLAYED, decision


@pl.jit
def gather_row_in_kernel(src: pl.Tensor[[ROWS, COLS], pl.FP32], index: pl.Tensor[[2], pl.INT32],
                         out: pl.Out[pl.Tensor[[2, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_rows"):
        for k in pl.range(2):
            row = pl.read(index, [k])
            out[k : k + 1, :] = pl.add(src[row : row + 1, :], 1.0)
    return out


def test_an_offset_read_inside_a_kernel_is_read_again_by_every_replay():
    src = torch.randn(ROWS, COLS)
    for i in range(CALLS):
        rows = [(5 * i + 2) % ROWS, (7 * i) % ROWS]
        out = torch.zeros(2, COLS)
        decision = decided(gather_row_in_kernel, src, torch.tensor(rows, dtype=torch.int32), out)
        assert torch.equal(out, src[rows] + 1.0), f"call {i} read rows {rows}"
    assert decision.kind == REPLAYED, decision


@pl.jit
def gather_cast_row(src: pl.Tensor[[ROWS, COLS], pl.FP32], index: pl.Tensor[[1], pl.INT32],
                    out: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
    row = pl.cast(pl.read(index, [0]), pl.INDEX)
    lo = pl.min(row, ROWS - 1)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_row"):
        out[0:1, :] = pl.add(src[lo : lo + 1, :], 0.0)
    return out


def test_casts_and_scalar_min_of_a_read_value_stay_data_and_bad_values_still_fail_on_the_engine():
    src = torch.randn(ROWS, COLS)
    kinds = []
    for i in range(CALLS):
        out = torch.zeros(1, COLS)
        kinds.append(decided(gather_cast_row, src, torch.tensor([i % ROWS], dtype=torch.int32), out).kind)
        assert torch.equal(out, src[i % ROWS :][:1]), f"call {i}"
    assert kinds.count(REPLAYED) == TIMES_REPLAYED and kinds[-1] == REPLAYED, kinds
    with run_stats.collect() as stats, pytest.raises(Exception, match="test_replay.py"):
        gather_cast_row(src, torch.tensor([-3], dtype=torch.int32), torch.zeros(1, COLS))   # the engine's error
    assert stats.replay.kind == GUARD_MISS, stats.replay


EPS = 0.5


@pl.jit
def float_arithmetic(x: pl.Tensor[[ROWS, COLS], pl.FP32], count: pl.Tensor[[1], pl.INT32],
                     scales: pl.Tensor[[2], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    n = pl.read(count, [0])
    gain = pl.read(scales, [1])   # a float read from data
    factor = 1.0 / n + EPS * n    # a plain float on the left of a value read from data
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        y[:, :] = pl.add(pl.mul(x, factor), gain * 2.0)
    if 0.5 < n:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="bump"):
            y[0:1, :] = pl.add(y[0:1, :], pl.max(gain, 1.0))
    return y


def test_float_arithmetic_on_values_read_from_data_is_recomputed_by_every_replay():
    x = torch.randn(ROWS, COLS)
    made = []
    with policy_scope(**KEEP):
        for i in range(CALLS):
            n, gain = i % 3 + 1, 0.25 * (i % 5) + 0.5
            y = torch.empty(ROWS, COLS)
            count, gains = torch.tensor([n], dtype=torch.int32), torch.tensor([0.0, gain])
            made.append(decided(float_arithmetic, x, count, gains, y))
            want = x * (1.0 / n + EPS * n) + gain * 2.0
            want[0] += max(gain, 1.0)
            assert torch.equal(y, want), f"call {i}: n={n} gain={gain}"
    kinds = [d.kind for d in made]
    # the guards: `0.5 < n` and which side of pl.max(gain, 1.0) won; calls on the other side ran on the engine
    assert [guards(d) for d in made if d.kind == REPLAYED][-1:] == [2], made
    assert kinds.count(REPLAYED) >= 3 and kinds.count(GUARD_MISS) >= 1, kinds


@pl.jit
def math_of_a_read_value(x: pl.Tensor[[ROWS, COLS], pl.FP32], count: pl.Tensor[[1], pl.INT32],
                         y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    n = pl.read(count, [0])
    factor = math.sqrt(n + 0.5)   # C code reading a float without asking: the recorded code pins it first
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        y[:, :] = pl.mul(x, factor)
    return y


def test_numbers_read_from_data_passed_to_math_functions_are_pinned():
    x = torch.randn(ROWS, COLS)
    kinds = []
    with policy_scope(**KEEP):
        for i in range(CALLS + 3):
            n = 4 if i < CALLS else i
            y = torch.empty(ROWS, COLS)
            kinds.append(decided(math_of_a_read_value, x, torch.tensor([n], dtype=torch.int32), y).kind)
            assert torch.equal(y, x * math.sqrt(n + 0.5)), f"call {i}: n={n}"
    assert REPLAYED in kinds[:CALLS] and kinds[CALLS:] == [GUARD_MISS] * 3, kinds


@pl.jit
def computed_scale(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
    total = pl.create_tensor([1, 1], dtype=pl.FP32)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="sum"):
        total[:, :] = pl.row_sum(x[0:1, :])
    scale = pl.read(total, [0, 0])   # data the run computed, used only as data
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        y[:, :] = pl.mul(x[1:2, :], scale)
    return y


def test_a_value_read_from_data_the_run_computed_is_read_again_where_it_was_read():
    for i in range(CALLS):
        x = torch.randn(ROWS, COLS)
        y = torch.empty(1, COLS)
        decision = decided(computed_scale, x, y)
        assert torch.equal(y, x[1:2] * x[0:1].sum(dim=-1, keepdim=True)), f"call {i}"
    assert decision.kind == REPLAYED and guards(decision) == 0, decision


SCALES = [1.0, 2.0, 3.0, 4.0]


@pl.jit
def steered(x: pl.Tensor[[ROWS, COLS], pl.FP32], idx: pl.Tensor[[2], pl.INT32],
            y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    k = pl.read(idx, [0])
    n = pl.read(idx, [1])
    scale = SCALES[k]   # a plain Python list indexed by data
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        y[:, :] = pl.mul(x, scale)
    for j in pl.range(n):   # a loop bound read from data
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="bump"):
            y[j : j + 1, :] = pl.add(y[j : j + 1, :], 1.0)
    if n > ROWS // 2:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="last"):
            y[ROWS - 1 : ROWS, :] = pl.add(y[ROWS - 1 : ROWS, :], 100.0)
    return y


def test_data_that_takes_another_course_than_recorded_runs_on_the_engine():
    x = torch.randn(ROWS, COLS)

    def check(k, n):
        y = torch.empty(ROWS, COLS)
        decision = decided(steered, x, torch.tensor([k, n], dtype=torch.int32), y)
        want = x * SCALES[k]
        want[:n] += 1.0
        if n > ROWS // 2:
            want[ROWS - 1] += 100.0
        assert torch.equal(y, want), f"k={k} n={n}"
        return decision.kind

    with policy_scope(**KEEP):
        assert [check(2, 3) for _ in range(CALLS)][-1] == REPLAYED   # recorded with k=2, n=3; replayed
        assert check(1, 3) == GUARD_MISS    # the list index differs (pinned: Python reads it silently)
        assert check(2, 5) == GUARD_MISS    # the loop bound differs
        assert check(2, 12) == GUARD_MISS   # the `if` goes the other way
        assert check(2, 3) == REPLAYED
        kinds = [check(i % 4, i % ROWS) for i in range(POLICY.misses)]
        # it missed more often than it replayed: dropped, the data's course runs on the engine from then on
        assert kinds[0] == GUARD_MISS and kinds[-1] == ENGINE and check(2, 3) == ENGINE, kinds
    assert replay.decisions(steered)[0].kind == ENGINE


@pl.jit
def read_after_write(x: pl.Tensor[[ROWS, COLS], pl.FP32], idx: pl.InOut[pl.Tensor[[1], pl.INT32]],
                     y: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="bump"):
        idx[0:1] = pl.add(idx[0:1], 1)
    row = pl.read(idx, [0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_row"):
        y[0:1, :] = pl.add(x[row : row + 1, :], 0.0)
    return y


def test_a_block_placing_a_window_at_data_the_run_wrote_first_replays_as_one_call_of_its_kernel():
    # a guard on the row would come too late (the run computes it): the first recording is refused inside the
    # block `copy_row`, the next one calls that block as it is, with the row as code read where the run read it
    x = torch.randn(ROWS, COLS)
    decisions = []
    with policy_scope(**KEEP):
        for i in range(CALLS):
            y = torch.empty(1, COLS)
            decisions.append(decided(read_after_write, x, torch.tensor([i % (ROWS - 1)], dtype=torch.int32), y))
            assert torch.equal(y, x[i % (ROWS - 1) + 1 :][:1]), f"call {i}"
    kinds = [d.kind for d in decisions]
    assert kinds[:POLICY.normal_runs + 2] == [ENGINE] * (POLICY.normal_runs + 1) + [RECORDED], kinds
    assert kinds[-1] == REPLAYED and REFUSED not in kinds and GUARD_MISS not in kinds, kinds
    again = decisions[POLICY.normal_runs].reason
    assert "refused inside a block" in again and "(test_replay.py:" in again, again   # names the user's line
    assert "1 kernel blocks called as they are" in decisions[-1].reason and guards(decisions[-1]) == 0


@pl.jit
def bounded_by_counts(x: pl.Tensor[[ROWS, COLS], pl.FP32], counts: pl.Tensor[[1], pl.INT32],
                      y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="live_rows"):
        n = pl.read(counts, [0])   # read inside the block from an entry tensor
        for r in pl.range(n):      # a row loop bounded by it: a guard on it, made inside the block
            y[r : r + 1, :] = pl.add(x[r : r + 1, :], 1.0)
    return y


def test_a_block_whose_guards_miss_more_often_than_not_is_recorded_again_as_one_call_of_its_kernel():
    # the count differs every call: the block's loop-bound guard misses; after `misses` misses the specialisation
    # is recorded again with that block called as it is (no guard), and replays from then on
    x = torch.randn(ROWS, COLS)
    kinds = []
    assert ROWS > POLICY.normal_runs + 1 + POLICY.misses   # (a new count on every call until it is dropped)
    with policy_scope(**KEEP):
        for i in range(POLICY.normal_runs + 1 + POLICY.misses + 2 + 2 * POLICY.trial_replays + 2):
            n = i % ROWS
            y = torch.zeros(ROWS, COLS)
            decision = decided(bounded_by_counts, x, torch.tensor([n], dtype=torch.int32), y)
            kinds.append(decision.kind)
            want = torch.zeros(ROWS, COLS)
            want[:n] = x[:n] + 1.0
            assert torch.equal(y, want), f"call {i} (n={n})"
    first = POLICY.normal_runs + 1
    assert kinds[first:first + POLICY.misses] == [GUARD_MISS] * POLICY.misses, kinds
    assert kinds[first + POLICY.misses] == RECORDED and kinds[-1] == REPLAYED, kinds
    assert GUARD_MISS not in kinds[first + POLICY.misses:] and ENGINE in kinds[first + POLICY.misses:], kinds
    assert "1 kernel blocks called as they are" in decision.reason and guards(decision) == 0, decision


@pl.jit
def scale_rows(x: pl.Tensor[[ROWS, COLS], pl.FP32], factor: pl.Scalar[pl.FP32],
               y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, 4):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            y[r : r + 4, :] = pl.add(pl.mul(x[r : r + 4, :], factor), 1.0)
    return y


def test_each_scalar_value_and_layout_gets_its_own_recording():
    x = torch.randn(ROWS, COLS)
    for factor in (2.0, 3.0):
        for _ in range(CALLS):
            y = torch.empty(ROWS, COLS)
            scale_rows(x, factor, y)
            assert torch.equal(y, x * factor + 1.0)
    wide = torch.randn(COLS, ROWS).t()    # same shape, other strides
    for _ in range(CALLS):
        y = torch.empty(ROWS, COLS)
        scale_rows(wide, 2.0, y)
        assert torch.equal(y, wide * 2.0 + 1.0)
    assert len(replay.decisions(scale_rows)) == 3


def test_a_scalar_passed_as_a_one_element_tensor_is_not_replayed_by_its_tensor_layout():
    x = torch.randn(ROWS, COLS)
    for i in range(CALLS):
        y = torch.empty(ROWS, COLS)
        scale_rows(x, torch.tensor(float(i + 1)), y)
        assert torch.equal(y, x * float(i + 1) + 1.0), f"call {i}"


def test_a_call_whose_input_aliases_its_output_keeps_warning_and_stays_right():
    """y is x itself: a recording made with distinct tensors must not serve it, and the warning about writing an
    In parameter comes on every call, replayed ones too."""
    for i in range(CALLS):
        x = torch.randn(ROWS, COLS)
        scale_rows(x, 3.0, torch.empty(ROWS, COLS))
    kinds = []
    for i in range(CALLS):
        x = torch.randn(ROWS, COLS)
        expect = x * 2.0 + 1.0
        with pytest.warns(InWriteWarning, match="writes into 'x'"):
            kinds.append(decided(scale_rows, x, 2.0, x).kind)
        assert torch.equal(x, expect), f"call {i}"
    assert kinds[-1] == REPLAYED, f"the aliased call replays, warning each time: {kinds}"


def test_replay_off_records_nothing():
    x = torch.randn(ROWS, COLS)
    kernel = pl.jit(scale_rows.fn)
    for knobs in (dict(CHECK="reference"), dict(REPLAY="0")):
        with config.scope(**knobs):
            for _ in range(CALLS):
                assert decided(kernel, x, 5.0, torch.empty(ROWS, COLS)).kind == DISABLED
    with policy_scope(enabled=False):
        for _ in range(CALLS):
            assert decided(kernel, x, 5.0, torch.empty(ROWS, COLS)).kind == DISABLED
    assert replay.decisions(kernel) == []


def record(fn, *inputs):
    """fn's torch calls on `inputs`, recorded; returns (recorder, replay function)."""
    recorder = Recorder(list(inputs))
    with recorder:
        result = fn(*inputs)
    if recorder.refused:
        return recorder, None
    source = recorder.source([recorder.name_of(result)])
    return recorder, compile_trace(source, recorder.constants)


def test_recorded_function_recomputes_from_new_inputs():
    def f(a, b):
        c = torch.mul(a, b).sum(-1, keepdim=True)
        return a - c

    _, replayed = record(f, torch.randn(4, 4), torch.randn(4, 4))
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert torch.equal(replayed(a, b)[0], f(a, b))


def test_two_scatters_over_one_index_sort_it_once_and_check_it_once():
    """The op library's last-write-wins sort and bounds assert, repeated for a second destination over the same
    index, run once in the replay (a pure tuple-returning call is shared; a repeated assert is dropped)."""
    def f(idx, k, v):
        torch._assert_async(((idx >= 0) & (idx < 8)).all(), "index outside")
        ordered, order = torch.sort(idx, stable=True)
        torch._assert_async(((idx >= 0) & (idx < 8)).all(), "index outside")
        ordered2, order2 = torch.sort(idx, stable=True)
        return k[order] + v[order2]

    inputs = [torch.tensor([3, 1, 3, 0]), torch.randn(4), torch.randn(4)]
    recorder = Recorder(inputs)
    with recorder:
        result = f(*inputs)
    source = recorder.source([recorder.name_of(result)])
    replayed = compile_trace(source, recorder.constants)
    idx, k, v = torch.tensor([2, 2, 0, 1]), torch.randn(4), torch.randn(4)
    assert torch.equal(replayed(idx, k, v)[0], f(idx, k, v))
    assert source.count("sort_") == 1 and source.count("assertasync_") == 1, source


def test_a_repeated_call_is_shared_only_while_nothing_writes_its_memory():
    def f(x):
        first = x.clone()
        second = x.clone()                 # same call, same input: but `first` is written below
        first.view(-1)[0] = 100.0          # through a view: `first` itself is never named as written
        return torch.add(first, second)

    _, replayed = record(f, torch.randn(2, 2))
    x = torch.randn(2, 2)
    assert torch.equal(replayed(x)[0], f(x))


def test_reads_of_memory_written_in_between_are_not_shared():
    def f(x):
        before = torch.exp(x)
        x.mul_(2.0)
        after = torch.exp(x)
        return torch.sub(after, before)

    _, replayed = record(f, torch.randn(3))
    x1 = torch.randn(3)
    x2 = x1.clone()
    assert torch.equal(replayed(x1)[0], f(x2))


def test_constants_are_computed_once_unless_written_or_returned():
    def f(x):
        mask = torch.arange(4) < 2      # from constants only: kept from the recording
        buf = torch.zeros(4)            # from constants, but written below: computed each time
        buf[0] = 5.0
        return torch.where(mask, x, buf)

    recorder = Recorder([torch.randn(4)])
    with recorder:
        result = f(*recorder._alive[:1])
    source = recorder.source([recorder.name_of(result)])
    replayed = compile_trace(source, recorder.constants)
    calls = [line for line in source.splitlines()[1:] if not line.strip().startswith(("#", "return", "del "))]
    assert "kept: v" in source and len(calls) == 3, source   # zeros, its write, where: not arange and lt
    x = torch.randn(4)
    assert torch.equal(replayed(x)[0], f(x))
    _, made = record(lambda x: torch.ones(3), torch.randn(3))
    assert made(x)[0] is not made(x)[0], "a returned tensor is made afresh on every call"
    _, view = record(lambda x: torch.ones(2, 3)[0], torch.randn(3))
    first = view(x)[0]
    first.fill_(7.0)
    assert torch.equal(view(x)[0], torch.ones(3)), "a returned view's memory is made afresh on every call"


def test_data_dependent_python_value_refuses_but_constant_data_does_not():
    recorder, _ = record(lambda x: x * float(x.sum()), torch.randn(3))
    assert "reads tensor data" in recorder.refused
    recorder, replayed = record(lambda x: x * float(torch.tensor(2.5)), torch.randn(3))
    assert recorder.refused is None
    x = torch.randn(3)
    assert torch.equal(replayed(x)[0], x * 2.5)


def test_data_shaped_results_refuse_unless_computed_from_constants():
    recorder, _ = record(lambda x: x[x > 0].sum() + x, torch.randn(5))
    assert "shape depends on data" in recorder.refused
    # a mask built from constants (as a valid box is): the same every run
    recorder, replayed = record(lambda x: x + torch.nonzero(torch.arange(5) < 3).numel(), torch.randn(5))
    assert recorder.refused is None
    x = torch.randn(5)
    assert torch.equal(replayed(x)[0], x + 3)


SEEN = []


def note(value):
    SEEN.append(value)


@pl.jit
def noted(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    note(ROWS)   # the user's own Python: a replay would skip it
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy"):
        y[:, :] = pl.add(x, 0.0)
    return y


def test_a_program_calling_plain_python_is_never_replayed():
    SEEN.clear()
    kinds = [decided(noted, torch.randn(ROWS, COLS), torch.empty(ROWS, COLS)).kind for _ in range(CALLS)]
    assert len(SEEN) == CALLS
    assert kinds == [ENGINE] * POLICY.normal_runs + [REFUSED] * (CALLS - POLICY.normal_runs), kinds
    assert "noted calls plain Python" in replay.decisions(noted)[0].reason


def test_stats_print_each_replay_decision_as_kind_and_reason(capsys):
    """PYPTO_STATS=1: replays, recordings, refusals and misses each print `pypto-rt stats [<entry>]: <kind>:
    <reason>`, the decision the call noted."""
    fresh, fresh_steered = pl.jit(scale_rows.fn), pl.jit(steered.fn)
    fresh_noted = pl.jit(noted.fn)
    x = torch.randn(ROWS, COLS)
    printed = []
    with config.scope(STATS="1"), policy_scope(**KEEP):
        for _ in range(CALLS):
            fresh(x, 2.0, torch.empty(ROWS, COLS))
            fresh_noted(x, torch.empty(ROWS, COLS))
        for n in [3] * CALLS + [5]:
            decision = decided(fresh_steered, x, torch.tensor([2, n], dtype=torch.int32), torch.empty(ROWS, COLS))
            printed.append(f"pypto-rt stats [steered]: {decision}")
    lines = capsys.readouterr().err.splitlines()
    for kind in (RECORDED, REPLAYED, REFUSED):
        assert [ln for ln in lines if ln.startswith(f"pypto-rt stats [scale_rows]: {kind}: ") or
                ln.startswith(f"pypto-rt stats [noted]: {kind}: ")], (kind, lines)
    assert printed[-1].startswith(f"pypto-rt stats [steered]: {GUARD_MISS}: ") and printed[-1] in lines
    assert any(ln.startswith(printed[-2]) for ln in lines), "a replay's line: its decision, then its wall time"


def test_a_specialisation_whose_engine_runs_overlap_long_tasks_is_not_recorded():
    """The policy on the engine's own stats (timing on a shared machine would make this flaky): long tasks whose
    kernel time adds up to twice the wall time ran side by side; short ones or serial ones get recorded."""
    from pypto_rt.binding import bind_call

    x = torch.randn(ROWS, COLS)
    for stats, recorded in (({"tasks": 4, "kernel_ns": 40_000_000, "wall_ns": 20_000_000}, False),
                            ({"tasks": 4, "kernel_ns": 4_000_000, "wall_ns": 2_000_000}, True),     # 1 ms tasks
                            ({"tasks": 4, "kernel_ns": 40_000_000, "wall_ns": 39_000_000}, True)):  # one at a time
        kernel = pl.jit(scale_rows.fn)
        binding = bind_call(kernel, (x, 2.0, torch.empty(ROWS, COLS)), {})
        engine_runs = []

        def run_on_engine(inline):
            engine_runs.append(inline)
            return None, stats

        for _ in range(POLICY.normal_runs + 1):
            with run_stats.collect() as noted:
                replay.run(kernel, binding, run_on_engine)
        assert engine_runs[-1] is recorded, stats   # the third call records (inline) or runs on the engine
        assert noted.replay.kind == (RECORDED if recorded else ENGINE), noted.replay


def test_the_op_library_calls_torch_only_where_a_recording_sees_it():
    """The recorder sees torch calls through torch's function mode; `torch.ops.aten...` and `torch._C` calls
    bypass it, so a replay would silently skip them."""
    import pypto_rt.ops as ops_package
    folder = os.path.dirname(ops_package.__file__)
    hidden = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            text = open(os.path.join(folder, name)).read()
            hidden += [f"{name}: {pattern}" for pattern in ("torch.ops.", "torch._C", "torch._VF", "ctypes")
                       if pattern in text]
    assert hidden == []


def test_in_place_operators_count_as_writes_and_others_do_not():
    def f(x):
        y = x.clone()
        first = torch.exp(y)
        y += 1.0                        # __iadd__: writes y
        flipped = ~(x > 0)              # __invert__: writes nothing
        again = ~(x > 0)
        return torch.exp(y) + first + flipped + again

    recorder, replayed = record(f, torch.randn(5))
    x = torch.randn(5)
    assert torch.equal(replayed(x)[0], f(x))


def test_outputs_left_out_of_the_call_are_new_tensors_on_every_replayed_call():
    x = torch.randn(ROWS, COLS)
    results = [scale_rows(x, 4.0) for _ in range(CALLS)]
    for y in results:
        assert torch.equal(y, x * 4.0 + 1.0)
    assert len({id(y) for y in results}) == CALLS and len({y.data_ptr() for y in results}) == CALLS


def test_a_recording_that_would_hold_too_much_memory_is_refused():
    with policy_scope(max_held_bytes=1024):
        recorder, replayed = record(lambda x: torch.exp(x) + torch.ones(1000), torch.randn(1000))
    assert replayed is None and "GiB of intermediate tensors" in recorder.refused
    recorder, replayed = record(lambda x: torch.exp(x) + torch.ones(1000), torch.randn(1000))
    assert recorder.refused is None, "outside the scope, the declared limit holds again"


TABLE = torch.tensor([3.0, 5.0])
SCALE = torch.tensor(2.0)


def test_an_outside_tensor_read_into_python_refuses_since_its_contents_may_change():
    for read in (lambda x: x * float(TABLE[0]), lambda x: x * float(SCALE), lambda x: x[torch.nonzero(TABLE > 4)]):
        recorder, _ = record(read, torch.randn(3))
        assert recorder.refused and "data" in recorder.refused


TILES, TILE = 4, 4


@pl.jit
def add_tiles(x: pl.Tensor[[TILES * TILE, COLS], pl.FP32], y: pl.Out[pl.Tensor[[TILES * TILE, COLS], pl.FP32]]):
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_tile"):
            y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], 1.0)
    return y


def test_the_recorded_run_executes_the_program_as_it_was_compiled():
    x = torch.randn(ROWS, COLS)
    with config.scope(COALESCE="0"):   # one task per 4-row tile (a program follows the knob in force)
        add_tiles(x, torch.empty(ROWS, COLS))
        for _ in range(CALLS):
            y = torch.empty(ROWS, COLS)
            decision = decided(add_tiles, x, y)
            assert torch.equal(y, x + 1.0)
    calls = int(re.search(r"replay of (\d+) torch calls", decision.reason).group(1))
    assert decision.kind == REPLAYED and calls >= 3 * TILES, f"one tile at a time, as on the engine: {decision}"


def test_the_trial_times_replays_against_warm_engine_runs_between_them():
    kernel = pl.jit(scale_rows.fn)
    x = torch.randn(ROWS, COLS)
    ways = [decided(kernel, x, 2.0, torch.empty(ROWS, COLS)).kind for _ in range(CALLS)]
    trial = ways[POLICY.normal_runs + 2:][: 2 * POLICY.trial_replays]
    assert ways[: POLICY.normal_runs + 2] == [ENGINE] * POLICY.normal_runs + [RECORDED, REPLAYED], ways
    assert trial == [ENGINE, REPLAYED] * POLICY.trial_replays, ways


def test_a_policy_scope_changes_the_trial_for_its_block_only():
    kernel = pl.jit(scale_rows.fn)
    x = torch.randn(ROWS, COLS)
    with policy_scope(normal_runs=0, trial_replays=0):   # record at once, keep the replay without a trial
        ways = [decided(kernel, x, 2.0, torch.empty(ROWS, COLS)).kind for _ in range(3)]
    assert ways == [RECORDED, REPLAYED, REPLAYED], ways
    other = [decided(kernel, x, 3.0, torch.empty(ROWS, COLS)).kind for _ in range(POLICY.normal_runs + 1)]
    assert other == [ENGINE] * POLICY.normal_runs + [RECORDED], other
    with pytest.raises(TypeError, match="no field"):
        with policy_scope(normal_run=0):
            pass


@pl.jit
def returns_a_read(scales: pl.Tensor[[2], pl.FP32]):
    return pl.read(scales, [1])


def test_an_entry_returning_a_value_read_from_data_gives_a_plain_number_and_is_not_replayed():
    for i in range(CALLS):
        with run_stats.collect() as stats:
            got = returns_a_read(torch.tensor([0.0, 0.5 * i]))
        assert type(got) is float and got == 0.5 * i, f"call {i}: {got!r}"
    assert stats.replay.kind == REFUSED and "returns a value read from tensor data" in stats.replay.reason


def make_local_kernel():
    @pl.jit
    def local_add(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add"):
            y[:, :] = pl.add(x[:, :], 1.0)
        return y
    return local_add


def test_a_kernel_defined_in_a_function_replays():
    """Its qualified name (`make_local_kernel.<locals>.local_add`) names the generated replay function."""
    kernel = make_local_kernel()
    for _ in range(CALLS):
        x, y = torch.randn(4, 8), torch.zeros(4, 8)
        decision = decided(kernel, x, y)
        assert torch.equal(y, x + 1.0)
    assert decision.kind == REPLAYED, decision
