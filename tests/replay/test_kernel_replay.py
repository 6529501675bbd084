"""Kernel replay: the engine's tasks run their kernel's recorded torch calls instead of the op library's Python.

What users depend on: every task still gives bit for bit what its kernel gives (the same torch calls, in the same
order), for any loop index, block index or scalar input and on new data; a block whose inputs take another course
than the recorded one (an `if` on the loop index, a value read from data) runs the kernel; a kernel that calls
plain Python keeps running it, block after block; recordings on worker threads do not disturb each other; new
shapes get their own recording; PYPTO_KERNEL_REPLAY=0 turns it off.
"""
from __future__ import annotations

import os


import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.orchestration.program import host_program
from pypto_rt.orchestration.task_runner import kernel_replays
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import ENGINE as ON_ENGINE
from pypto_rt.run_stats import REFUSED, REPLAYED
from tests.orchestration import conformance_cases

KERNELS = conformance_cases.KERNELS
TILE, TILES = 8, 12
ENGINE = {"REPLAY": "0", "COALESCE": "0"}   # every call on the engine, one task per tile
POLICY = ReplayPolicy()


@pytest.fixture(autouse=True)
def replay_at_once():
    """Record the first block of each specialisation and keep its replay, whatever the timing says."""
    with policy_scope(kernel_normal_runs=0, kernel_slower=float("inf")):
        yield


def specialisations(kernel, region: int = 0) -> list:
    """How the blocks of each specialisation of region `region` of entry `kernel` run (BlockReplayStates)."""
    found = kernel_replays(host_program(kernel, coalesce=ENGINE["COALESCE"]).kernels[region])
    return found.states() if found is not None else []


@pl.jit
def scale_tiles(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32], y: pl.Out[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale_tile"):
            y[i * TILE : (i + 1) * TILE, :] = pl.mul(pl.add(x[i * TILE : (i + 1) * TILE, :], 1.0), 0.5)
    return y


def test_tasks_replay_their_kernel_bit_for_bit_at_every_loop_index_and_on_new_data():
    hits = []
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(TILE * TILES, TILE)
        got, want = torch.zeros_like(x), torch.zeros_like(x)
        with config.scope(**ENGINE):
            scale_tiles(x, got)
            with config.scope(KERNEL_REPLAY="0"):
                scale_tiles(x, want)
        assert torch.equal(got, want), f"call {seed}"
        assert torch.equal(got, (x + 1.0) * 0.5)
        hits += [s.hits for s in specialisations(scale_tiles)]
    (spec,) = specialisations(scale_tiles)
    assert spec.decision.kind == REPLAYED and spec.misses == 0, spec
    # (while the first call records one block, the others may run the kernel on other workers)
    assert hits[2] - hits[1] == TILES   # later calls: every task replays


@pl.jit
def last_tiles_differ(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32],
                     y: pl.Out[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="by_index"):
            if i < TILES - 2:
                y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], 1.0)
            else:
                y[i * TILE : (i + 1) * TILE, :] = pl.sub(x[i * TILE : (i + 1) * TILE, :], 1.0)
    return y


def test_a_block_whose_loop_index_takes_another_branch_runs_the_kernel():
    x = torch.randn(TILE * TILES, TILE)
    y = torch.zeros_like(x)
    with config.scope(**ENGINE):
        last_tiles_differ(x, y)
        (before,) = specialisations(last_tiles_differ)
        last_tiles_differ(x, y)
    want = x.clone()
    want[: (TILES - 2) * TILE] += 1.0
    want[(TILES - 2) * TILE :] -= 1.0
    assert torch.equal(y, want)
    # the recorded (first) tile took the `if`: the tiles that do replay, the last two miss and run the kernel
    (after,) = specialisations(last_tiles_differ)
    assert (after.hits - before.hits, after.misses - before.misses) == (TILES - 2, 2)


@pl.jit
def offsets_from_data(src: pl.Tensor[[TILE * TILES, TILE], pl.FP32], slots: pl.Tensor[[TILES], pl.INT32],
                      dst: pl.InOut[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scatter_row_tile"):
            slot = pl.read(slots, [i])
            dst[slot * TILE : (slot + 1) * TILE, :] = pl.add(src[i * TILE : (i + 1) * TILE, :], 0.0)
    return dst


def test_values_a_kernel_reads_from_data_are_read_again_by_each_replayed_task():
    src = torch.randn(TILE * TILES, TILE)
    hits = []
    for seed in range(3):
        slots = torch.randperm(TILES, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        dst = torch.zeros_like(src)
        with config.scope(**ENGINE):
            offsets_from_data(src, slots, dst)
        want = torch.zeros_like(src)
        want.view(TILES, TILE, TILE)[slots.long()] = src.view(TILES, TILE, TILE)
        assert torch.equal(dst, want), f"permutation {seed}"
        hits += [s.hits for s in specialisations(offsets_from_data)]
    assert hits[2] - hits[1] == TILES


CALLED = []


def count_block(i):
    CALLED.append(int(i))


@pl.jit
def calls_python(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32], y: pl.Out[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="counted"):
            count_block(i)
            y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], 1.0)
    return y


def test_a_kernel_calling_plain_python_runs_it_in_every_task():
    CALLED.clear()
    x = torch.randn(TILE * TILES, TILE)
    y = torch.zeros_like(x)
    with config.scope(**ENGINE):
        calls_python(x, y)
        calls_python(x, y)
    assert CALLED == list(range(TILES)) * 2
    assert torch.equal(y, x + 1.0)
    (spec,) = specialisations(calls_python)
    assert spec.decision.kind == REFUSED and "count_block" in spec.decision.reason, spec


@pl.jit
def two_regions(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32], y: pl.Out[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="make"):
            t = pl.exp(x[i * TILE : (i + 1) * TILE, :])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="use"):
            y[i * TILE : (i + 1) * TILE, :] = pl.add(t, x[i * TILE : (i + 1) * TILE, :])
    return y


def test_a_replayed_region_hands_its_result_tensor_to_the_next_region():
    x = torch.randn(TILE * TILES, TILE)
    got, want = torch.zeros_like(x), torch.zeros_like(x)
    with config.scope(**ENGINE):
        two_regions(x, got)
    with config.scope(EXECUTOR="reference"):
        two_regions(x, want)
    assert torch.equal(got, want)
    states = [s for r in range(2) for s in specialisations(two_regions, r)]
    assert len(states) == 2 and all(s.decision.kind == REPLAYED and s.hits > 0 for s in states), states


BLOCKS = 4


@pl.jit
def spmd_offsets(x: pl.Tensor[[TILE * BLOCKS, TILE], pl.FP32], y: pl.Out[pl.Tensor[[TILE * BLOCKS, TILE], pl.FP32]]):
    for b in pl.spmd(BLOCKS, name_hint="rows"):
        r0 = b * TILE
        y[r0 : r0 + TILE, :] = pl.sub(x[r0 : r0 + TILE, :], pl.row_max(x[r0 : r0 + TILE, :]))
    return y


def test_spmd_blocks_replay_at_their_own_block_index():
    x = torch.randn(TILE * BLOCKS, TILE)
    got, want = torch.zeros_like(x), torch.zeros_like(x)
    with config.scope(**ENGINE):
        spmd_offsets(x, got)
        (before,) = specialisations(spmd_offsets)
        spmd_offsets(x, got)
    with config.scope(EXECUTOR="reference"):
        spmd_offsets(x, want)
    assert torch.equal(got, want)
    (after,) = specialisations(spmd_offsets)
    assert after.decision.kind == REPLAYED and after.hits - before.hits == BLOCKS


def test_blocks_recorded_and_replayed_on_worker_threads_match_the_kernel():
    x = torch.randn(TILE * TILES, TILE)
    got, want = torch.zeros_like(x), torch.zeros_like(x)
    with config.scope(**ENGINE, HOST_INLINE_US="0", NUM_WORKERS="2"):   # every task on a worker
        for _ in range(3):
            two_regions(x, got)
            with config.scope(KERNEL_REPLAY="0"):
                two_regions(x, want)
            assert torch.equal(got, want)


def test_a_new_shape_gets_its_own_recording_and_the_knob_turns_replay_off():
    @pl.jit
    def add_rows(x: pl.Tensor[[pl.dynamic("N"), TILE], pl.FP32], y: pl.Out[pl.Tensor[[pl.dynamic("N"), TILE], pl.FP32]]):
        for i in pl.range(x.shape[0] // TILE):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_rows"):
                y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], 2.0)
        return y

    for rows in (2 * TILE, 5 * TILE):
        x = torch.randn(rows, TILE)
        y = torch.zeros_like(x)
        with config.scope(**ENGINE):
            add_rows(x, y)
        assert torch.equal(y, x + 2.0)
    assert len(specialisations(add_rows)) == 2
    before = [s.hits for s in specialisations(add_rows)]
    with config.scope(**ENGINE, KERNEL_REPLAY="0"):
        add_rows(x, y)
    assert [s.hits for s in specialisations(add_rows)] == before


@pytest.mark.parametrize("name", KERNELS)
def test_conformance_kernels_on_the_engine_match_with_and_without_kernel_replay(name):
    entry, specs, outputs = conformance_cases.load(name, "kernel_replay")
    for seed in range(3):
        values = conformance_cases.fresh_inputs(specs, seed)
        results = []
        for knob in ("1", "0"):
            copies = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
            with config.scope(REPLAY="0", KERNEL_REPLAY=knob):
                entry(*[copies[s.name] for s in specs])
            results.append(copies)
        for out in outputs:
            assert torch.equal(results[0][out], results[1][out]), f"{name}: call {seed}: output {out} differs"


@pl.jit
def slot_per_view(src: pl.Tensor[[TILE * TILES, TILE], pl.FP32], slots: pl.Tensor[[TILES], pl.INT32],
                  dst: pl.InOut[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES):
        mine = slots[i : i + 1]   # a view at another place in the same memory for each task
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scatter_by_view"):
            slot = pl.read(mine, [0])
            dst[slot * TILE : (slot + 1) * TILE, :] = pl.add(src[i * TILE : (i + 1) * TILE, :], 0.0)
    return dst


def test_a_block_that_read_data_at_its_place_in_memory_replays_only_at_that_place():
    src = torch.randn(TILE * TILES, TILE)
    slots = torch.randperm(TILES, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    for _ in range(2):
        dst = torch.zeros_like(src)
        with config.scope(**ENGINE):
            slot_per_view(src, slots, dst)
        want = torch.zeros_like(src)
        want.view(TILES, TILE, TILE)[slots.long()] = src.view(TILES, TILE, TILE)
        assert torch.equal(dst, want)
    (spec,) = specialisations(slot_per_view)
    assert spec.misses > 0   # the views elsewhere in memory miss (and ran the kernel)


@pl.jit
def sized_by_argument(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32], rows: pl.Scalar[pl.INDEX],
                      y: pl.Out[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    for i in pl.range(TILES * TILE // rows):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="sized"):
            ones = pl.full([rows, TILE], dtype=pl.FP32, value=1.0)
            y[i * rows : (i + 1) * rows, :] = pl.add(x[i * rows : (i + 1) * rows, :], ones)
    return y


def test_a_number_input_used_as_a_size_is_pinned_so_other_sizes_run_the_kernel():
    x = torch.randn(TILE * TILES, TILE)
    for rows in (TILE, TILE, 2 * TILE):
        y = torch.zeros_like(x)
        with config.scope(**ENGINE):
            sized_by_argument(x, rows, y)
        assert torch.equal(y, x + 1.0), f"rows={rows}"
    (spec,) = specialisations(sized_by_argument)
    assert spec.decision.kind == REPLAYED and spec.misses == TILES // 2   # the 16-row tiles miss: made in the kernel


def test_a_replay_slower_than_its_kernel_is_dropped_after_its_trial():
    kernel = pl.jit(scale_tiles.fn)   # its own compiled program and replays
    x = torch.randn(TILE * TILES, TILE)
    # any replay counts as slower than the kernel's blocks
    with policy_scope(kernel_slower=0.0, kernel_normal_runs=2):
        for _ in range(2):
            y = torch.zeros_like(x)
            with config.scope(**ENGINE):
                kernel(x, y)
            assert torch.equal(y, (x + 1.0) * 0.5)
    (spec,) = specialisations(kernel)
    assert spec.decision.kind == ON_ENGINE, spec   # dropped: its blocks run the kernel
    # after its whole trial; blocks already replaying on other workers when the verdict came finish their replay
    trial = POLICY.kernel_warm_replays + POLICY.kernel_trial_replays
    assert trial <= spec.hits < trial + (os.cpu_count() or 1), spec


@pl.jit
def window_at(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32], start: pl.Scalar[pl.INDEX],
              y: pl.Out[pl.Tensor[[TILE, TILE], pl.FP32]]):
    for i in pl.range(2):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="window_at"):
            y[:, :] = pl.add(x[start + i : start + i + TILE, :], 1.0)
    return y


def test_a_window_a_replay_would_place_past_its_tensor_runs_the_kernel():
    x = torch.randn(TILE * TILES, TILE)
    for start in range(0, 5):
        y = torch.zeros(TILE, TILE)
        with config.scope(**ENGINE):
            window_at(x, start, y)
        assert torch.equal(y, x[start + 1 : start + 1 + TILE] + 1.0)
    (before,) = specialisations(window_at)
    assert before.decision.kind == REPLAYED, before
    got, want = torch.zeros(TILE, TILE), torch.zeros(TILE, TILE)
    with config.scope(**ENGINE):   # the second window runs one row past the end: a partial tile, which torch
        window_at(x, TILE * TILES - TILE, got)   # slicing would clip differently; the guard sends it to the kernel
        with config.scope(KERNEL_REPLAY="0"):
            window_at(x, TILE * TILES - TILE, want)
    assert torch.equal(got, want)
    (after,) = specialisations(window_at)
    assert after.misses == before.misses + 1


@pl.jit
def rows_from_a_list(x: pl.Tensor[[TILE * TILES, TILE], pl.FP32], y: pl.Out[pl.Tensor[[TILE * TILES, TILE], pl.FP32]]):
    starts = [TILE * (TILES - 1 - i) for i in range(TILES)]   # a Python list the region reads
    for i in pl.range(TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="from_list"):
            y[i * TILE : (i + 1) * TILE, :] = pl.add(x[starts[i] : starts[i] + TILE, :], 0.0)
    return y


def test_a_kernel_given_a_container_runs_it_in_every_task():
    x = torch.randn(TILE * TILES, TILE)
    for _ in range(2):
        y = torch.zeros_like(x)
        with config.scope(**ENGINE):
            rows_from_a_list(x, y)
        assert torch.equal(y, x.view(TILES, TILE, TILE).flip(0).reshape(TILE * TILES, TILE))
    assert specialisations(rows_from_a_list) == []


def test_a_run_does_not_keep_the_callers_tensors_alive_after_it_returns():
    import gc
    import weakref
    x = torch.randn(TILE * TILES, TILE)
    y = torch.zeros_like(x)
    with config.scope(**ENGINE):
        scale_tiles(x, y)
    gone = weakref.ref(x)
    del x
    gc.collect()
    assert gone() is None


def test_each_run_hands_the_policy_in_force_to_the_blocks_on_its_workers():
    kernel = pl.jit(scale_tiles.fn)
    x = torch.randn(TILE * TILES, TILE)
    with policy_scope(kernel_normal_runs=10_000), config.scope(**ENGINE):
        kernel(x, torch.zeros_like(x))
    (spec,) = specialisations(kernel)
    assert spec.decision.kind == ON_ENGINE and spec.hits == 0, spec
    with config.scope(**ENGINE):   # the fixture's policy again: the next block is recorded, later ones replay
        for _ in range(2):   # (while one block records, the others may run the kernel on other workers)
            kernel(x, torch.zeros_like(x))
    (spec,) = specialisations(kernel)
    assert spec.decision.kind == REPLAYED and spec.hits > 0, spec
