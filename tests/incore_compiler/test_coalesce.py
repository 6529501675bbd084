"""Coalescing: which tiled loops merge into wide tasks, and that merging never changes a result."""
from __future__ import annotations

import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.frontend.analyze import analyze, enclosing_statement
from pypto_rt.frontend.resolve import Env
from pypto_rt.incore_compiler.coalesce import plan_coalescing

ROWS, COLS, TILE = 64, 32, 16


def assert_matches_reference(kernel, x, **knobs):
    """The compiled run (coalesced where it can be) writes exactly what the reference executor writes."""
    want, got = torch.zeros(ROWS, COLS), torch.zeros(ROWS, COLS)
    with config.scope(EXECUTOR="reference"):
        kernel(x, want)
    with config.scope(**knobs):
        kernel(x, got)
    assert torch.equal(got, want)


def plan(kernel):
    ir = analyze(kernel)
    region = ir.regions[0]
    return plan_coalescing(Env(kernel.fn), region, enclosing_statement(ir.tree, region.stmt))


@pl.jit
def row_softmax(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="softmax"):
            t = pl.slice(x, [TILE, COLS], [r, 0])
            e = pl.exp(pl.row_expand_sub(t, pl.row_max(t)))
            y[r : r + TILE, :] = pl.row_expand_div(e, pl.row_sum(e))
    return y


@pl.jit
def column_tiles(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for c in pl.range(0, COLS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            t = x[:, c : c + TILE]
            y[:, c : c + TILE] = pl.col_expand_mul(t, pl.col_max(t))
    return y


@pl.jit
def column_sums_of_row_tiles(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="colsum"):
            t = x[r : r + TILE, :]
            y[r : r + TILE, :] = pl.col_expand_sub(t, pl.col_sum(t))   # mixes the rows of one tile
    return y


@pl.jit
def reads_a_scalar_per_tile(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="first"):
            y[r : r + TILE, :] = pl.mul(x[r : r + TILE, :], pl.read(x, [r, 0]))
    return y


@pl.jit
def literal_step(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, 16):
        with pl.at(level=pl.Level.CORE_GROUP):
            y[r : r + 16, :] = pl.add(x[r : r + 16, :], 1.0)
    return y


def test_row_tiles_of_row_independent_ops_coalesce_along_rows():
    c = plan(row_softmax)
    assert c is not None and (c.var, c.dim, c.independent) == ("r", 0, True)


def test_column_tiles_of_column_ops_coalesce_along_columns():
    c = plan(column_tiles)
    assert c is not None and (c.var, c.dim, c.independent) == ("c", 1, False)


@pytest.mark.parametrize("kernel", [column_sums_of_row_tiles, reads_a_scalar_per_tile, literal_step])
def test_bodies_that_depend_on_the_tiling_do_not_coalesce(kernel):
    assert plan(kernel) is None


@pytest.mark.parametrize("kernel", [row_softmax, column_tiles, column_sums_of_row_tiles])
def test_coalesced_runs_match_the_reference_bit_for_bit(kernel):
    assert_matches_reference(kernel, torch.randn(ROWS, COLS), NUM_WORKERS="2")


@pl.jit
def shift_add(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.range(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="shift"):
            y[r : r + TILE, :] = pl.add(x[r : r + TILE, :], 1.0)
    return y


@pytest.mark.filterwarnings("ignore::pypto_rt.errors.InWriteWarning")
def test_a_sequential_loop_whose_output_aliases_its_input_keeps_iteration_order():
    assert plan(shift_add) is not None
    buf = torch.randn(ROWS + TILE, COLS)
    want = buf.clone()
    with config.scope(EXECUTOR="reference"):
        shift_add(want[:ROWS], want[TILE:])   # each tile reads what the previous iteration wrote
    shift_add(buf[:ROWS], buf[TILE:])
    assert torch.equal(buf, want)


@pl.jit
def spmd_rows(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for b in pl.spmd(ROWS // TILE, name_hint="rows"):
        r0 = b * TILE
        acc = pl.full([TILE, 1], dtype=pl.FP32, value=0.0)
        for c in pl.range(0, COLS, 8):
            acc = pl.add(acc, pl.row_sum(x[r0 : r0 + TILE, c : c + 8]))
        y[r0 : r0 + TILE, :] = pl.row_expand_sub(x[r0 : r0 + TILE, :], acc)
    return y


@pl.jit
def spmd_uses_block_index(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for b in pl.spmd(ROWS // TILE, name_hint="rows"):
        r0 = b * TILE
        y[r0 : r0 + TILE, :] = pl.mul(x[r0 : r0 + TILE, :], pl.cast(b, pl.FP32))
    return y


def test_spmd_blocks_with_a_row_offset_coalesce_and_match_the_reference():
    c = plan(spmd_rows)
    assert c is not None and c.new_offset and (c.var, c.dim) == ("r0", 0)
    assert plan(spmd_uses_block_index) is None
    x = torch.randn(ROWS, COLS)
    for kernel in (spmd_rows, spmd_uses_block_index):
        assert_matches_reference(kernel, x)


@pl.jit
def scaled_index(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for i in pl.range(ROWS // TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="tile"):
            y[i * TILE : (i + 1) * TILE, :] = pl.exp(x[i * TILE : (i + 1) * TILE, :])
    return y


@pl.jit
def index_used_as_a_value(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for i in pl.range(ROWS // TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="tile"):
            y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], pl.cast(i, pl.FP32))
    return y


def test_a_unit_step_index_scaled_by_the_tile_coalesces():
    c = plan(scaled_index)
    assert c is not None and c.new_offset and c.dropped == "i" and c.dim == 0
    assert plan(index_used_as_a_value) is None
    x = torch.randn(ROWS, COLS)
    for kernel in (scaled_index, index_used_as_a_value):
        assert_matches_reference(kernel, x)


CT = 8   # column tile of the 2-D grids


@pl.jit
def spmd_grid(x: pl.Tensor[[ROWS, COLS], pl.FP32], w: pl.Tensor[[COLS, COLS], pl.FP32],
              y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for b in pl.spmd((ROWS // TILE) * (COLS // CT), name_hint="grid"):
        r0 = (b // (COLS // CT)) * TILE
        c0 = (b % (COLS // CT)) * CT
        acc = pl.matmul(x[r0 : r0 + TILE, :], w[:, c0 : c0 + CT])
        y[r0 : r0 + TILE, c0 : c0 + CT] = pl.exp(pl.mul(acc, 0.125))
    return y


@pl.jit
def spmd_grid_with_row_sums(x: pl.Tensor[[ROWS, COLS], pl.FP32], w: pl.Tensor[[COLS, COLS], pl.FP32],
                            y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for b in pl.spmd((ROWS // TILE) * (COLS // CT), name_hint="grid"):
        r0 = (b // (COLS // CT)) * TILE
        c0 = (b % (COLS // CT)) * CT
        t = x[r0 : r0 + TILE, c0 : c0 + CT]
        y[r0 : r0 + TILE, c0 : c0 + CT] = pl.row_expand_sub(t, pl.row_sum(t))   # sums one column block only
    return y


def test_a_2d_block_grid_merges_its_columns_and_coalesces_its_rows():
    c = plan(spmd_grid)
    assert c is not None and (c.var, c.dim) == ("r0", 0)
    assert plan(spmd_grid_with_row_sums) is None
    x, w = torch.randn(ROWS, COLS), torch.randn(COLS, COLS)
    for kernel in (spmd_grid, spmd_grid_with_row_sums):
        want, got = torch.zeros(ROWS, COLS), torch.zeros(ROWS, COLS)
        with config.scope(EXECUTOR="reference"):
            kernel(x, w, want)
        with config.scope(REPLAY="0"):
            kernel(x, w, got)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)   # a wider matmul may sum in another order


@pl.jit
def add_a_tile_shaped_input(x: pl.Tensor[[ROWS, COLS], pl.FP32], b: pl.Tensor[[TILE, COLS], pl.FP32],
                            y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_b"):
            y[r : r + TILE, :] = pl.add(x[r : r + TILE, :], b)   # b meets every row tile as a whole
    return y


@pl.jit
def add_a_row_input(x: pl.Tensor[[ROWS, COLS], pl.FP32], b: pl.Tensor[[1, COLS], pl.FP32],
                    y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_b"):
            y[r : r + TILE, :] = pl.col_expand_add(x[r : r + TILE, :], b)
    return y


def test_an_input_broadcast_against_each_tile_merges_only_at_extent_one(capsys):
    """Merged tiles would meet a tile-shaped input at the wrong extent: the host checks its shape and keeps one
    task per iteration; a [1, COLS] row merges."""
    x = torch.randn(ROWS, COLS)
    assert plan(add_a_tile_shaped_input).untiled == ("b",) and plan(add_a_row_input).untiled == ("b",)
    for kernel, b, tasks in ((add_a_tile_shaped_input, torch.randn(TILE, COLS), ROWS // TILE),
                             (add_a_row_input, torch.randn(1, COLS), 1)):
        want, got = torch.zeros(ROWS, COLS), torch.zeros(ROWS, COLS)
        with config.scope(EXECUTOR="reference"):
            kernel(x, b, want)
        with config.scope(REPLAY="0", STATS="1", NUM_WORKERS="1"):
            kernel(x, b, got)
        assert torch.equal(got, want)
        assert f"{tasks} task" in capsys.readouterr().err


H = 8   # column tile of the inner loops


@pl.jit
def scale_columns(x: pl.Tensor[[ROWS, COLS], pl.FP32], w: pl.Tensor[[1, COLS], pl.FP32],
                  y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        total = pl.row_sum(x[:, 0:COLS])
        for hb in pl.range(COLS // H):          # no state carried: one wide pass
            h0 = hb * H
            t = pl.row_expand_mul(x[:, h0 : h0 + H], total)
            y[:, h0 : h0 + H] = pl.col_expand_mul(t, w[:, h0 : h0 + H])
    return y


@pl.jit
def running_columns(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="running"):
        acc = pl.full([ROWS, H], dtype=pl.FP32, value=0.0)
        for hb in pl.range(COLS // H):          # acc carries from one tile to the next: stays a loop
            h0 = hb * H
            acc = pl.add(acc, x[:, h0 : h0 + H])
            y[:, h0 : h0 + H] = acc
    return y


def _kernel_source(kernel, tmp_path):
    with config.scope(DUMP_DIR=str(tmp_path), CACHE_DIR="off", REPLAY="0"):
        kernel.state.clear()
        args = [torch.randn(ROWS, COLS)] + ([torch.randn(1, COLS)] if kernel is scale_columns else [])
        kernel(*args, torch.zeros(ROWS, COLS))
    return "".join(p.read_text() for p in tmp_path.glob("*kernel0.py"))


def test_an_inner_tile_loop_without_carried_state_runs_as_one_wide_pass(tmp_path):
    merged = _kernel_source(scale_columns, tmp_path / "a")
    assert "__disjoint" in merged and "__wide_chunks(COLS // H, H, (total, w, x, y))" in merged
    assert "__slice(__w0, __w0 + __w, None)" in merged
    assert "__disjoint" not in _kernel_source(running_columns, tmp_path / "b")
    x, w = torch.randn(ROWS, COLS), torch.randn(1, COLS)
    for kernel, args in ((scale_columns, (x, w)), (running_columns, (x,))):
        want, got = torch.zeros(ROWS, COLS), torch.zeros(ROWS, COLS)
        with config.scope(EXECUTOR="reference"):
            kernel(*args, want)
        with config.scope(REPLAY="0"):
            kernel(*args, got)
        assert torch.equal(got, want)


@pl.jit
def shift_right(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="shift"):
        for hb in pl.range(COLS // H):
            h0 = hb * H
            y[:, h0 : h0 + H] = pl.add(x[:, h0 : h0 + H], 1.0)
    return y


def test_a_merged_loop_whose_output_overlaps_its_input_shifted_runs_tile_by_tile():
    """y is x moved one tile right in one buffer: each tile reads what the previous one wrote, as written."""
    want, got = torch.randn(ROWS, COLS + H), None
    got = want.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # y writes into x's memory (an In parameter): warned, and meant here
        with config.scope(EXECUTOR="reference"):
            shift_right(want[:, :COLS], want[:, H:])
        with config.scope(REPLAY="0"):
            shift_right(got[:, :COLS], got[:, H:])
    assert torch.equal(got, want)


BIG_ROWS, BIG_COLS = 2048, 256   # 2 MiB per FP32 tensor


@pl.jit
def add_one_big(x: pl.Tensor[[BIG_ROWS, BIG_COLS], pl.FP32], y: pl.Out[pl.Tensor[[BIG_ROWS, BIG_COLS], pl.FP32]]):
    for r in pl.parallel(0, BIG_ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_one"):
            y[r : r + TILE, :] = pl.add(x[r : r + TILE, :], 1.0)
    return y


@pytest.mark.parametrize("cap_mb,tasks", [("0", 1), ("1", 4), ("64", 1)])
def test_a_coalesced_task_spans_at_most_the_chunk_bound_of_tile_data(capsys, cap_mb, tasks):
    """4 MiB of tile data (2 MiB read, 2 MiB written) on one worker: one task without a bound or under 64 MiB,
    four under 1 MiB; results as the reference's."""
    x = torch.randn(BIG_ROWS, BIG_COLS)
    want, got = torch.zeros(BIG_ROWS, BIG_COLS), torch.zeros(BIG_ROWS, BIG_COLS)
    with config.scope(EXECUTOR="reference"):
        add_one_big(x, want)
    with config.scope(REPLAY="0", STATS="1", NUM_WORKERS="1", COALESCE_CHUNK_MB=cap_mb):
        add_one_big(x, got)
    assert torch.equal(got, want)
    assert f"stats [add_one_big]: {tasks} task" in capsys.readouterr().err


def test_the_chunk_bound_splits_by_what_each_iteration_adds():
    from pypto_rt.incore_compiler.chunks import chunk_count
    mib = 2**20
    assert chunk_count(512, 2, 512 * mib, 2 * mib, 0) == 2              # no bound: one chunk per worker
    assert chunk_count(512, 2, 512 * mib, 2 * mib, 64 * mib) == 16      # 32 iterations (64 MiB) per task
    assert chunk_count(10, 2, 100 * mib, 20 * mib, 16 * mib) == 10      # an iteration beyond the bound: one each
    assert chunk_count(64, 2, 64 * 1024, 2048, 64 * mib) == 1           # small loops: still one task


def test_a_merged_tile_loop_runs_in_pieces_of_at_most_the_chunk_bound():
    from pypto_rt.incore_compiler.chunks import wide_chunks
    from pypto_rt.ops.value import TensorValue
    mib_each = [TensorValue(torch.zeros(1024, 256), pl.FP32) for _ in range(2)]   # 1 MiB each
    with config.scope(COALESCE_CHUNK_MB="0"):
        assert wide_chunks(32, 8, tuple(mib_each)) == [(0, 256)]
    with config.scope(COALESCE_CHUNK_MB="2"):
        assert wide_chunks(32, 8, tuple(mib_each) + (3, None)) == [(0, 256)]
    with config.scope(COALESCE_CHUNK_MB="1"):
        assert wide_chunks(32, 8, tuple(mib_each)) == [(0, 128), (128, 128)]
        assert wide_chunks(10, 8, tuple(mib_each) * 2) == [(0, 24), (24, 24), (48, 24), (72, 8)]
        assert wide_chunks(1, 8, tuple(mib_each)) == [(0, 8)]


@pl.jit
def scale_wide_columns(x: pl.Tensor[[BIG_ROWS, BIG_COLS], pl.FP32], w: pl.Tensor[[1, BIG_COLS], pl.FP32],
                       y: pl.Out[pl.Tensor[[BIG_ROWS, BIG_COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        total = pl.row_sum(x[:, 0:BIG_COLS])
        for hb in pl.range(BIG_COLS // H):
            h0 = hb * H
            t = pl.row_expand_mul(x[:, h0 : h0 + H], total)
            y[:, h0 : h0 + H] = pl.col_expand_mul(t, w[:, h0 : h0 + H])
    return y


def test_a_merged_tile_loop_in_pieces_matches_the_reference():
    x, w = torch.randn(BIG_ROWS, BIG_COLS), torch.randn(1, BIG_COLS)
    want, got = torch.zeros(BIG_ROWS, BIG_COLS), torch.zeros(BIG_ROWS, BIG_COLS)
    with config.scope(EXECUTOR="reference"):
        scale_wide_columns(x, w, want)
    with config.scope(REPLAY="0", COALESCE_CHUNK_MB="1"):
        scale_wide_columns(x, w, got)
    assert torch.equal(got, want)


# What an op allows comes from its OpDef (pypto_rt/ops/opdef.py), under every name it answers to: the hand-written
# base-name sets this replaced missed `pl.tensor.create` (an alias of `pl.create_tensor`), and counted every
# keyword outside a fixed list as a tensor operand, so `cmp_type="gt"` stopped a loop from merging.
@pl.jit
def adds_a_created_zero_tile(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="plus_zero"):
            y[r : r + TILE, :] = pl.add(x[r : r + TILE, :], pl.tensor.create([TILE, COLS], pl.FP32))
    return y


@pl.jit
def positive_mask(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="positive"):
            y[r : r + TILE, :] = pl.cmp(x[r : r + TILE, :], 0.0, cmp_type="gt")
    return y


@pytest.mark.parametrize("kernel", [adds_a_created_zero_tile, positive_mask], ids=lambda k: k.fn.__name__)
def test_op_aliases_and_attribute_keywords_do_not_stop_coalescing(kernel):
    c = plan(kernel)
    assert c is not None and (c.var, c.dim) == ("r", 0)
    assert_matches_reference(kernel, torch.randn(ROWS, COLS))
