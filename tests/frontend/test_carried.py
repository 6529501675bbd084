"""Carried loops mean what the real compiler's SSA makes of them, on both executors: after zero trips the
`pl.yield_` results are the initial values (a padded request's empty KV loop), and a body that only rebinds its
state names (the seed's form, no `pl.yield_`) carries them from one iteration to the next."""
import pytest
import torch

import pypto.language as pl
from pypto_rt import config

N = 8


@pytest.fixture(params=["reference", "compiled"], autouse=True)
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


@pl.jit
def sum_rows_yield(x: pl.Tensor[[4, N], pl.FP32], n: pl.Tensor[[1], pl.INT32],
                   y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="sum_rows"):
        acc0 = pl.full([1, N], dtype=pl.FP32, value=-1.0)
        for i, (acc,) in pl.range(pl.read(n, [0]), init_values=(acc0,)):
            acc_out = pl.yield_(pl.add(acc, x[i : i + 1, :]))
        y[:, :] = acc_out
    return y


@pl.jit
def sum_rows_rebind(x: pl.Tensor[[4, N], pl.FP32], n: pl.Tensor[[1], pl.INT32],
                    y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="sum_rows"):
        acc0 = pl.full([1, N], dtype=pl.FP32, value=-1.0)
        for i, (acc, count) in pl.range(pl.read(n, [0]), init_values=(acc0, 0)):
            acc = pl.add(acc, x[i : i + 1, :])
            count = count + 1
        y[:, :] = pl.adds(acc, count * 100.0)
    return y


@pytest.mark.parametrize("kernel", [sum_rows_yield, sum_rows_rebind])
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_carried_loops_sum_rows_and_keep_the_initial_values_after_zero_trips(kernel, rows):
    x = torch.randn(4, N)
    y = kernel(x, torch.tensor([rows], dtype=torch.int32))
    want = x[:rows].sum(0, keepdim=True) - 1.0
    if kernel is sum_rows_rebind:
        want = want + rows * 100.0
    torch.testing.assert_close(y, want)
