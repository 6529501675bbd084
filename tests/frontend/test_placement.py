"""Placement rules on both executors: what the real compiler accepts runs as it runs it, with one style warning at
the user's line (`pl.parallel` inside InCore code is a sequential loop there); what it rejects is an error at the
user's line. Where each rule comes from: notes/semantics_decisions.md."""
from __future__ import annotations

import inspect
import re
import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.errors import DSLError, StyleWarning

N = 8


@pytest.fixture(params=["compiled", "reference"])
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


def _style_warnings(run, times: int = 2):
    """The StyleWarnings of calling `run` `times` times (a second call must not repeat them)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):
            run()
    return [(w.filename, w.lineno, str(w.message)) for w in caught if issubclass(w.category, StyleWarning)]


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _cumsum_rows(x):
    return torch.cumsum(x, dim=0)


def test_parallel_in_pl_at_runs_sequentially_with_one_warning(executor):
    def k(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="cumsum"):
            acc = x[0:1, :]
            y[0:1, :] = acc
            for r in pl.parallel(1, 4):   # each iteration reads the one before: only a sequential loop is right
                acc = pl.add(acc, x[r : r + 1, :])
                y[r : r + 1, :] = acc
        return y
    kernel = pl.jit(k)
    x, y = torch.randn(4, N), torch.zeros(4, N)
    found = _style_warnings(lambda: kernel(x, y))
    assert [(f, line) for f, line, _ in found] == [(__file__, _line_of(k, "pl.parallel(1, 4)"))]
    assert "sequential loop" in found[0][2] and "pl.range" in found[0][2]
    torch.testing.assert_close(y, _cumsum_rows(x))


def test_parallel_in_an_spmd_body_runs_sequentially_with_one_warning(executor):
    def k(x: pl.Tensor[[2, 4, N], pl.FP32], y: pl.Out[pl.Tensor[[2, 4, N], pl.FP32]]):
        for b in pl.spmd(2, name_hint="blocks"):
            acc = x[b, 0:1, :]
            y[b, 0:1, :] = acc
            for r in pl.parallel(1, 4):
                acc = pl.add(acc, x[b, r : r + 1, :])
                y[b, r : r + 1, :] = acc
        return y
    kernel = pl.jit(k)
    x, y = torch.randn(2, 4, N), torch.zeros(2, 4, N)
    found = _style_warnings(lambda: kernel(x, y))
    assert [(f, line) for f, line, _ in found] == [(__file__, _line_of(k, "pl.parallel(1, 4)"))]
    torch.testing.assert_close(y, torch.cumsum(x, dim=1))


def test_parallel_in_an_incore_function_runs_sequentially_with_one_warning(executor):
    def helper(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        acc = pl.load(x, [0, 0], [1, N])
        y = pl.store(acc, [0, 0], y)
        for r in pl.parallel(1, 4):
            acc = pl.add(acc, pl.load(x, [r, 0], [1, N]))
            y = pl.store(acc, [r, 0], y)
        return y
    incore = pl.jit.incore(helper)

    def entry(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        return incore(x, y)
    kernel = pl.jit(entry)
    x, y = torch.randn(4, N), torch.zeros(4, N)
    found = _style_warnings(lambda: kernel(x, y))
    assert [(f, line) for f, line, _ in found] == [(__file__, _line_of(helper, "pl.parallel(1, 4)"))]
    torch.testing.assert_close(y, _cumsum_rows(x))


def test_pipeline_outside_incore_code_runs_as_a_loop_with_one_warning(executor):
    def k(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        for r in pl.pipeline(4, stage=2):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="row"):
                y[r : r + 1, :] = pl.mul(x[r : r + 1, :], 2.0)
        return y
    kernel = pl.jit(k)
    x, y = torch.randn(4, N), torch.zeros(4, N)
    found = _style_warnings(lambda: kernel(x, y))
    assert [(f, line) for f, line, _ in found] == [(__file__, _line_of(k, "pl.pipeline(4, stage=2)"))]
    torch.testing.assert_close(y, x * 2.0)


def test_parallel_around_regions_gives_no_warning(executor):
    def k(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        for r in pl.parallel(4):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="row"):
                for kb in pl.pipeline(1, stage=2):
                    y[r : r + 1, :] = pl.mul(x[r : r + 1, :], 2.0)
        return y
    kernel = pl.jit(k)
    x, y = torch.randn(4, N), torch.zeros(4, N)
    assert _style_warnings(lambda: kernel(x, y)) == []
    torch.testing.assert_close(y, x * 2.0)


def _spmd_in_pl_at(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        for b in pl.spmd(4):   # error: pl.spmd inside an InCore region
            y[b : b + 1, :] = x[b : b + 1, :]
    return y


def _nested_pl_at(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        with pl.at(level=pl.Level.CORE_GROUP):   # error: nested inside another InCore region
            y[:, :] = x
    return y


def _break_in_parallel(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    for r in pl.parallel(4):
        with pl.at(level=pl.Level.CORE_GROUP):
            y[r : r + 1, :] = x[r : r + 1, :]
        if r == 2:
            break   # error: `break` in a pl.parallel loop
    return y


def _continue_in_unroll(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        for r in pl.unroll(4):
            if r == 2:
                continue   # error: `continue` in a pl.unroll loop
            y[r : r + 1, :] = x[r : r + 1, :]
    return y


def _break_leaving_a_region(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    for r in pl.range(4):
        with pl.at(level=pl.Level.CORE_GROUP):
            y[r : r + 1, :] = x[r : r + 1, :]
            break   # error: inside an InCore region leaves the region
    return y


@pytest.mark.parametrize("fn", [_spmd_in_pl_at, _nested_pl_at, _break_in_parallel, _continue_in_unroll,
                                _break_leaving_a_region])
def test_placement_errors_point_at_the_user_line(executor, fn):
    line = _line_of(fn, "# error: ")
    expected = inspect.getsourcelines(fn)[0][line - fn.__code__.co_firstlineno].split("# error: ")[1].strip()
    with pytest.raises(DSLError, match=re.escape(expected)) as info:
        pl.jit(fn)(torch.zeros(4, N), torch.zeros(4, N))
    assert (info.value.span.file, info.value.span.line) == (__file__, line)
