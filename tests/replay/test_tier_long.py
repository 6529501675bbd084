"""The compiled tier of a long replay (replay.tier_segments, `tier_max_segment_calls`): a replay of more torch lines
than the limit is compiled in segments called in a row (a cold inductor build grows about quadratically with a
graph's length, issue 17).

What users depend on: the segmented call gives the replay's results, with the writes and reads across segment
boundaries in program order (a later segment reads what an earlier one wrote into an InOut argument); the cuts fall
between unrolled tiles (no temporary crosses one); a segment that fails to compile keeps the whole replay and says
why; a short replay is still compiled whole. Compiles take seconds each: two kernels are compiled here.
"""
from __future__ import annotations

import ast

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.replay import tier_process, tier_rows, tier_segments
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import FAILED, TRIAL, tiers

TILES, ROWS, COLS = 6, 4, 16
MAX_LINES = 18   # a tile is 9 replay lines: two tiles a segment, three segments
WARM = 8         # calls that reach a steady replay: engine runs, the recording, the engine trial
KEEP = dict(slower=float("inf"), trial_replays=0, tier_trial_calls=1 << 30, tier_after_replays=0,
            tier_after_replayed_ms=0, tier_max_segment_calls=MAX_LINES)


def running_source():
    """Each tile reads the accumulator the tile before wrote (InOut), then writes its rows of y from it."""
    @pl.jit
    def running(x: pl.Tensor[[TILES * ROWS, COLS], pl.FP32], acc: pl.InOut[pl.Tensor[[ROWS, COLS], pl.FP32]],
                y: pl.Out[pl.Tensor[[TILES * ROWS, COLS], pl.FP32]]):
        for tb in pl.range(TILES):
            t0 = tb * ROWS
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="step"):
                acc[:, :] = pl.add(pl.mul(acc[:, :], 0.5), pl.exp(x[t0:t0 + ROWS, :]))
                y[t0:t0 + ROWS, :] = pl.mul(acc[:, :], 2.0)
        return acc, y
    return running


def want_running(x, acc):
    acc, rows = acc.clone(), []
    for t in range(TILES):
        acc = acc * 0.5 + torch.exp(x[t * ROWS:(t + 1) * ROWS])
        rows.append(acc * 2.0)
    return acc, torch.cat(rows)


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(TILES * ROWS, COLS, generator=g), torch.randn(ROWS, COLS, generator=g), \
        torch.empty(TILES * ROWS, COLS)


def _warm(entry, **policy):
    with config.scope(TIER="eager"), policy_scope(**{**KEEP, **policy}):
        for seed in range(WARM):
            entry(*_inputs(seed))
    (found,) = tiers(entry)
    return found


@pytest.mark.timeout(300)
def test_a_long_replay_runs_compiled_in_segments_and_matches_with_writes_in_order():
    running = running_source()
    found = _warm(running)
    assert found.state == TRIAL and found.tiered is not None, found.text
    segments = found.segments.segments
    assert len(segments) == 3 and all(not s.kept for s in segments), found.text
    assert "segmented: 3 runs of torch lines (a long replay, cut by length)" in found.text, found.text
    # each cut between tiles: a segment takes the arguments (and numbers), never another segment's temporary
    assert all(name.startswith("a") for s in segments for name in s.inputs), [s.inputs for s in segments]
    found.chosen = found.tiered   # swapped in: the calls below run the compiled segments
    for seed in range(100, 103):
        x, acc, y = _inputs(seed)
        want_acc, want_y = want_running(x, acc)
        got_acc, got_y = running(x, acc, y)
        assert got_acc is acc and got_y is y   # the caller's own tensors, written in place
        torch.testing.assert_close(acc, want_acc)
        torch.testing.assert_close(y, want_y)


@pytest.mark.timeout(300)
def test_a_failing_segment_compile_keeps_the_whole_replay_and_says_why(monkeypatch):
    real, calls = tier_process.compile_apart, []

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected: the C++ compiler is missing")
        return real(*args, **kwargs)
    monkeypatch.setattr(tier_process, "compile_apart", second_fails)
    running = running_source()
    found = _warm(running)
    assert found.state == FAILED and found.chosen is not None, found.text
    assert found.why.startswith("segment 1 (replay lines ") and "injected" in found.why, found.why
    with config.scope(TIER="eager"), policy_scope(**KEEP):   # the replay, right
        x, acc, y = _inputs(200)
        want_acc, want_y = want_running(x, acc)
        running(x, acc, y)
    torch.testing.assert_close(acc, want_acc)
    torch.testing.assert_close(y, want_y)


def test_the_split_by_length_cuts_between_tiles_and_keeps_the_order():
    """No compile: the segments called as replayed functions give the replay's results and writes."""
    running = running_source()
    with config.scope(TIER="off"), policy_scope(**KEEP):
        for seed in range(WARM):
            running(*_inputs(seed))
    (found,) = tiers(running)
    source, constants = found.source, found.constants
    for max_lines, count in ((MAX_LINES, 3), (20, 3), (30, 2)):
        split = tier_segments.segmented(source, constants, None, 8, max_lines)
        lines = [tier_segments._lines(s.statements) for s in split.segments]
        assert len(lines) == count and max(lines) <= max_lines and all(n % 9 == 0 for n in lines), lines
        # x and y are given as the rows their tiles touch (a graph writing y writes back only those); acc whole
        assert all(set(s.rows) == {"a0", "a2"} for s in split.segments), [s.rows for s in split.segments]
        assert split.segments[1].rows["a2"] == (lines[0] // 9 * ROWS, (lines[0] + lines[1]) // 9 * ROWS)
        fn = split.function({s.index: s.replayed for s in split.segments})
        x, acc, _ = _inputs(300)
        want_acc, want_y = want_running(x, acc)
        got_acc, got_y = fn(x, acc, torch.empty(TILES * ROWS, COLS))
        torch.testing.assert_close(got_acc, want_acc)
        torch.testing.assert_close(got_y, want_y)
    assert tier_segments.segmented(source, constants, None, 8, 0) is None      # no limit: compiled whole
    assert tier_segments.segmented(source, constants, None, 8, 1000) is None   # short enough: compiled whole


def test_only_inputs_used_through_constant_row_slices_are_given_as_rows():
    statements = ast.parse("v1 = a0[4:8, :]\na1[8:12, 0:2] = v1\nv2 = a0[0:4]\nv3 = mul(a2[0:4], a2)\n"
                           "a3[s0:8] = v2\n").body
    rebased, rows = tier_rows.rebased(statements, ["a0", "a1", "a2", "a3"])
    assert rows == {"a0": (0, 8), "a1": (8, 12)}   # a2 is also used whole, a3 at a bound read from data
    assert [ast.unparse(s) for s in rebased][:2] == ["v1 = a0[4:8, :]", "a1[0:4, 0:2] = v1"]
    assert ast.unparse(statements[1]) == "a1[8:12, 0:2] = v1"   # (the given statements are left as they were)
