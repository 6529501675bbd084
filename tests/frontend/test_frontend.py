"""The front end: regions found and outlined with the right inputs and results; placement errors at the user's line."""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
from pypto_rt.errors import DSLError, UnknownOpError
from pypto_rt.frontend.analyze import analyze

N = 8


@pl.jit
def two_stages(x: pl.Tensor[[16, N], pl.FP32], y: pl.Out[pl.Tensor[[16, N], pl.FP32]]):
    h = pl.create_tensor([16, N], dtype=pl.FP32)
    for r in pl.parallel(0, 16, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage1"):
            tile = pl.mul(x[r : r + 8, :], 2.0)
            h = pl.assemble(h, tile, [r, 0])
    for r in pl.parallel(0, 16, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage2"):
            y[r : r + 8, :] = pl.add(h[r : r + 8, :], 1.0)
    return y


def test_regions_are_outlined_with_inputs_and_in_place_results():
    ir = analyze(two_stages)
    first, second = ir.regions
    assert (first.kind, first.live_ins, first.results, first.aliased) == ("at", ["h", "r", "x"], [], ["h"])
    assert (second.live_ins, second.results) == (["h", "r", "y"], [])
    assert first.span.line == two_stages.fn.__code__.co_firstlineno + 4


@pl.jit
def carried_across_regions(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    for k in pl.range(4):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="accumulate"):
            if k == 0:
                acc = x[0:1, :]
            else:
                acc = pl.add(acc, x[k : k + 1, :])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="store"):
        y[0:1, :] = acc
    return y


def test_a_value_first_bound_in_a_loop_is_carried_to_later_iterations():
    ir = analyze(carried_across_regions)
    accumulate, store = ir.regions
    assert "acc" in accumulate.live_ins and accumulate.results == ["acc"]
    assert store.live_ins == ["acc", "y"]
    x = torch.arange(4 * N, dtype=torch.float32).reshape(4, N)
    y = torch.zeros(1, N)
    carried_across_regions(x, y)
    assert torch.equal(y, x.sum(0, keepdim=True))


def _placement_error(fn, match):
    with pytest.raises(DSLError, match=match) as info:
        analyze(pl.jit(fn))
    assert info.value.span.file == __file__
    return info.value


def test_parallel_inside_pl_at_is_a_style_note_at_its_line():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        with pl.at(level=pl.Level.CORE_GROUP):
            for i in pl.parallel(4):
                pass
    (note,) = analyze(pl.jit(k)).notes
    assert (note.file, note.line) == (__file__, k.__code__.co_firstlineno + 2)
    assert "sequential loop" in note.message and "pl.range" in note.message


def test_spmd_inside_pl_at_is_an_error():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        with pl.at(level=pl.Level.CORE_GROUP):
            for b in pl.spmd(4):
                pass
    _placement_error(k, "pl.spmd inside an InCore region")


def test_pipeline_outside_incore_code_is_a_style_note():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        for i in pl.pipeline(4, stage=2):
            pass
    (note,) = analyze(pl.jit(k)).notes
    assert note.line == k.__code__.co_firstlineno + 1 and "pl.pipeline outside InCore code" in note.message


def test_nested_incore_regions_are_an_error():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        with pl.at(level=pl.Level.CORE_GROUP):
            with pl.at(level=pl.Level.CORE_GROUP):
                pass
    _placement_error(k, "nested inside another InCore region")


def test_return_inside_a_region_is_an_error():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        with pl.at(level=pl.Level.CORE_GROUP):
            return x
    _placement_error(k, "`return` inside an InCore region")


def test_pipeline_inside_a_region_and_host_loops_are_fine():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        for r in pl.parallel(0, 16, 8):
            with pl.at(level=pl.Level.CORE_GROUP):
                for kb in pl.pipeline(2, stage=2):
                    pass
    ir = analyze(pl.jit(k))
    assert len(ir.regions) == 1 and ir.notes == []


def test_unknown_op_is_reported_when_compiling():
    def k(x: pl.Tensor[[16, N], pl.FP32]):
        with pl.at(level=pl.Level.CORE_GROUP):
            pl.no_such_op(x)
    with pytest.raises(UnknownOpError, match="no_such_op") as info:
        analyze(pl.jit(k))
    assert info.value.span.line == k.__code__.co_firstlineno + 2


@pl.jit.inline
def doubled(row: pl.Tensor[[1, N], pl.FP32]) -> pl.Tensor[[1, N], pl.FP32]:
    return pl.mul(row, 2.0)


@pl.jit
def calls_an_inline_helper_in_a_region(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    for b in pl.spmd(4, name_hint="rows"):
        y[b : b + 1, :] = doubled(pl.slice(x, [1, N], [b, 0]))
    return y


def test_an_inline_helper_called_inside_a_region_may_return_a_value():
    x = torch.randn(4, N)
    assert torch.equal(calls_an_inline_helper_in_a_region(x, torch.zeros(4, N)), x * 2.0)
