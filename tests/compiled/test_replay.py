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
from pypto_rt import config
from pypto_rt.errors import InWriteWarning
from pypto_rt.orchestration import replay
from pypto_rt.orchestration.torch_trace import Recorder, compile_trace
from tests.compiled import conformance_cases

KERNELS = conformance_cases.KERNELS
# engine runs, recording, warm-up replay, the trial (replays alternating with engine runs), a few more
CALLS = replay.NORMAL_RUNS + 1 + 1 + 2 * replay.TRIAL_REPLAYS + 2
REPLAYED = CALLS - replay.NORMAL_RUNS - 1 - replay.TRIAL_REPLAYS   # how many of them replay


def modes(kernel) -> list[str]:
    return [s.mode() for s in kernel.state.replay.values()]


def call(entry, specs, values, **knobs):
    values = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    with config.scope(**knobs):
        entry(*[values[s.name] for s in specs])
    return values


@pytest.mark.parametrize("name", KERNELS)
def test_replayed_calls_match_the_engine_bit_for_bit_on_new_data(name, monkeypatch):
    # keep every recording, whatever the timing says, so each replayable kernel is compared as a replay
    monkeypatch.setattr(replay, "SLOWER", float("inf"))
    monkeypatch.setattr(replay, "PARALLEL", float("inf"))
    entry, specs, outputs = conformance_cases.load(name, "replay")
    for seed in range(CALLS):
        inputs = conformance_cases.fresh_inputs(specs, seed)
        got = call(entry, specs, inputs)
        want = call(entry, specs, inputs, REPLAY="0")
        for out in outputs:
            assert torch.equal(got[out], want[out]), f"{name}: call {seed}: output {out} differs from the engine's"
    kernel = getattr(entry, "kernel", entry)
    (mode,) = modes(kernel)
    assert mode.startswith("replay"), mode
    if name.startswith("c06"):   # host pl.reads steer an `if` and place each write: read again, guarded
        assert "guards on values read from data" in mode, mode


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
        gather_row(src, torch.tensor([row], dtype=torch.int32), out)
        assert torch.equal(out, src[row : row + 1] * 2.0), f"call {i} read row {row}"
    assert modes(gather_row)[0].startswith("replay"), modes(gather_row)


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
        gather_row_in_kernel(src, torch.tensor(rows, dtype=torch.int32), out)
        assert torch.equal(out, src[rows] + 1.0), f"call {i} read rows {rows}"
    assert modes(gather_row_in_kernel)[0].startswith("replay"), modes(gather_row_in_kernel)


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
    for i in range(CALLS):
        out = torch.zeros(1, COLS)
        gather_cast_row(src, torch.tensor([i % ROWS], dtype=torch.int32), out)
        assert torch.equal(out, src[i % ROWS :][:1]), f"call {i}"
    (spec,) = gather_cast_row.state.replay.values()
    assert spec.mode().startswith("replay") and spec.hits == REPLAYED
    with pytest.raises(Exception, match="test_replay.py"):   # a negative row: the engine's error, at the user's line
        gather_cast_row(src, torch.tensor([-3], dtype=torch.int32), torch.zeros(1, COLS))
    assert spec.misses == 1


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


def test_float_arithmetic_on_values_read_from_data_is_recomputed_by_every_replay(monkeypatch):
    monkeypatch.setattr(replay, "SLOWER", float("inf"))
    x = torch.randn(ROWS, COLS)
    for i in range(CALLS):
        n, gain = i % 3 + 1, 0.25 * (i % 5) + 0.5
        y = torch.empty(ROWS, COLS)
        float_arithmetic(x, torch.tensor([n], dtype=torch.int32), torch.tensor([0.0, gain]), y)
        want = x * (1.0 / n + EPS * n) + gain * 2.0
        want[0] += max(gain, 1.0)
        assert torch.equal(y, want), f"call {i}: n={n} gain={gain}"
    (spec,) = float_arithmetic.state.replay.values()
    # the guards: `0.5 < n` and which side of pl.max(gain, 1.0) won; calls on the other side ran on the engine
    assert spec.mode().startswith("replay") and "2 guards" in spec.mode(), spec.mode()
    assert spec.hits >= 3 and spec.misses >= 1, (spec.hits, spec.misses)


@pl.jit
def math_of_a_read_value(x: pl.Tensor[[ROWS, COLS], pl.FP32], count: pl.Tensor[[1], pl.INT32],
                         y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    n = pl.read(count, [0])
    factor = math.sqrt(n + 0.5)   # C code reading a float without asking: the recorded code pins it first
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        y[:, :] = pl.mul(x, factor)
    return y


def test_numbers_read_from_data_passed_to_math_functions_are_pinned(monkeypatch):
    monkeypatch.setattr(replay, "SLOWER", float("inf"))
    x = torch.randn(ROWS, COLS)
    for i in range(CALLS + 3):
        n = 4 if i < CALLS else i
        y = torch.empty(ROWS, COLS)
        math_of_a_read_value(x, torch.tensor([n], dtype=torch.int32), y)
        assert torch.equal(y, x * math.sqrt(n + 0.5)), f"call {i}: n={n}"
    (spec,) = math_of_a_read_value.state.replay.values()
    assert spec.hits >= 1 and spec.misses == 3, (spec.hits, spec.misses)


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
        computed_scale(x, y)
        assert torch.equal(y, x[1:2] * x[0:1].sum(dim=-1, keepdim=True)), f"call {i}"
    (mode,) = modes(computed_scale)
    assert mode.startswith("replay") and "guards" not in mode, mode


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


def test_data_that_takes_another_course_than_recorded_runs_on_the_engine(monkeypatch):
    monkeypatch.setattr(replay, "SLOWER", float("inf"))
    x = torch.randn(ROWS, COLS)

    def check(k, n):
        y = torch.empty(ROWS, COLS)
        steered(x, torch.tensor([k, n], dtype=torch.int32), y)
        want = x * SCALES[k]
        want[:n] += 1.0
        if n > ROWS // 2:
            want[ROWS - 1] += 100.0
        assert torch.equal(y, want), f"k={k} n={n}"

    for _ in range(CALLS):   # recorded with k=2, n=3; replayed
        check(2, 3)
    (spec,) = steered.state.replay.values()
    hits = spec.hits
    check(1, 3)   # the list index differs (pinned: Python reads it silently)
    check(2, 5)   # the loop bound differs
    check(2, 12)  # the `if` goes the other way
    check(2, 3)
    assert (spec.hits, spec.misses) == (hits + 1, 3)
    for i in range(replay.MISSES):
        check(i % 4, i % ROWS)
    assert modes(steered)[0].startswith("engine (the data took another course than recorded in "), modes(steered)


@pl.jit
def read_after_write(x: pl.Tensor[[ROWS, COLS], pl.FP32], idx: pl.InOut[pl.Tensor[[1], pl.INT32]],
                     y: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="bump"):
        idx[0:1] = pl.add(idx[0:1], 1)
    row = pl.read(idx, [0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_row"):
        y[0:1, :] = pl.add(x[row : row + 1, :], 0.0)
    return y


def test_a_read_of_data_the_run_wrote_first_that_places_a_window_is_never_replayed():
    x = torch.randn(ROWS, COLS)
    for i in range(CALLS):
        y = torch.empty(1, COLS)
        read_after_write(x, torch.tensor([i % (ROWS - 1)], dtype=torch.int32), y)
        assert torch.equal(y, x[i % (ROWS - 1) + 1 :][:1]), f"call {i}"
    (mode,) = modes(read_after_write)
    assert mode.startswith("engine (the run's course depends on a value it read (pl.read) from data it computed"), mode
    assert "(test_replay.py:" in mode, "the reason names the user's line"


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
    assert len(modes(scale_rows)) == 3


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
    for i in range(CALLS):
        x = torch.randn(ROWS, COLS)
        expect = x * 2.0 + 1.0
        with pytest.warns(InWriteWarning, match="writes into 'x'"):
            scale_rows(x, 2.0, x)
        assert torch.equal(x, expect), f"call {i}"
    aliased = [s for s in scale_rows.state.replay.values() if s.warnings]
    assert len(aliased) == 1 and aliased[0].hits > 0, "the aliased call replays, warning each time"


def test_replay_off_records_nothing():
    x = torch.randn(ROWS, COLS)
    with config.scope(REPLAY="0"):
        for _ in range(CALLS):
            scale_rows.state.replay = {}
            scale_rows(x, 5.0, torch.empty(ROWS, COLS))
            assert scale_rows.state.replay == {}


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
    calls = [line for line in source.splitlines()[1:] if not line.strip().startswith(("#", "return"))]
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
    for _ in range(CALLS):
        noted(torch.randn(ROWS, COLS), torch.empty(ROWS, COLS))
    assert len(SEEN) == CALLS
    assert modes(noted)[0].startswith("engine (noted calls plain Python (")


def test_stats_say_how_each_call_ran_and_why(capsys, monkeypatch):
    monkeypatch.setattr(replay, "SLOWER", float("inf"))   # keep the recordings, whatever the timing says
    fresh, fresh_gather, fresh_steered = pl.jit(scale_rows.fn), pl.jit(gather_row.fn), pl.jit(steered.fn)
    fresh_read_after_write = pl.jit(read_after_write.fn)
    x = torch.randn(ROWS, COLS)
    with config.scope(STATS="1"):
        for _ in range(CALLS):
            fresh(x, 2.0, torch.empty(ROWS, COLS))
        for i in range(CALLS):
            fresh_gather(x, torch.tensor([i], dtype=torch.int32), torch.empty(1, COLS))
        for i in range(CALLS):
            fresh_read_after_write(x, torch.tensor([i], dtype=torch.int32), torch.empty(1, COLS))
        for n in [3] * CALLS + [5]:
            fresh_steered(x, torch.tensor([2, n], dtype=torch.int32), torch.empty(ROWS, COLS))
    err = capsys.readouterr().err
    assert re.search(r"recorded in [0-9.]+ ms: from now on replay of", err) and "· wall" in err
    assert "guards failed (the data takes another course): engine run" in err
    assert ": from now on engine (the run's course depends on a value it read (pl.read) from data it computed" in err
    assert "(test_replay.py:" in err, "the reason points at the user's line"


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

        for _ in range(replay.NORMAL_RUNS + 1):
            replay.run(kernel, binding, run_on_engine)
        assert engine_runs[-1] is recorded, stats   # the third call records (inline) or runs on the engine
        if not recorded:
            assert modes(kernel) == ["engine (its tasks run in parallel on the engine's workers)"]


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


def test_a_recording_that_would_hold_too_much_memory_is_refused(monkeypatch):
    from pypto_rt.orchestration import torch_trace
    monkeypatch.setattr(torch_trace, "MAX_HELD_BYTES", 1024)
    recorder, replayed = record(lambda x: torch.exp(x) + torch.ones(1000), torch.randn(1000))
    assert replayed is None and "GiB of intermediate tensors" in recorder.refused


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
    with config.scope(COALESCE="0"):   # compiled now: one task per 4-row tile (a program follows the knob in force)
        add_tiles(x, torch.empty(ROWS, COLS))
        for _ in range(CALLS):
            y = torch.empty(ROWS, COLS)
            add_tiles(x, y)
            assert torch.equal(y, x + 1.0)
    (spec,) = add_tiles.state.replay.values()
    assert spec.calls >= 3 * TILES, f"one tile at a time, as on the engine: {spec.mode()}"


def test_the_trial_times_replays_against_warm_engine_runs_between_them():
    kernel = pl.jit(scale_rows.fn)
    x = torch.randn(ROWS, COLS)
    ways = []
    for _ in range(CALLS):
        (spec,) = (kernel.state.replay or {None: replay._Specialisation()}).values()
        before = (len(spec.engine_ns), spec.hits)
        kernel(x, 2.0, torch.empty(ROWS, COLS))
        (spec,) = kernel.state.replay.values()
        ways.append("engine" if len(spec.engine_ns) > before[0] else "replay" if spec.hits > before[1] else "record")
    trial = ways[replay.NORMAL_RUNS + 2:][: 2 * replay.TRIAL_REPLAYS]
    assert ways[: replay.NORMAL_RUNS + 2] == ["engine"] * replay.NORMAL_RUNS + ["record", "replay"], ways
    assert trial == ["engine", "replay"] * replay.TRIAL_REPLAYS, ways


@pl.jit
def returns_a_read(scales: pl.Tensor[[2], pl.FP32]):
    return pl.read(scales, [1])


def test_an_entry_returning_a_value_read_from_data_gives_a_plain_number_and_is_not_replayed():
    for i in range(CALLS):
        got = returns_a_read(torch.tensor([0.0, 0.5 * i]))
        assert type(got) is float and got == 0.5 * i, f"call {i}: {got!r}"
    (mode,) = modes(returns_a_read)
    assert mode.startswith("engine (the entry returns a value read from tensor data"), mode


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
        kernel(x, y)
        assert torch.equal(y, x + 1.0)
    assert modes(kernel)[0].startswith("replay of")
