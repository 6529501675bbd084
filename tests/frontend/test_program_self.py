"""`self` inside a @pl.jit kernel and the inline functions it calls names the program's functions (the real
@pl.jit materialises the kernel as a @pl.program): kernel-library code writes `pl.spmd_submit(self.helper, ...)`."""
import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.errors import DSLError

ROWS, N = 4, 16


@pl.jit.incore
def double_row(x: pl.Tensor[[ROWS, N], pl.FP32], out: pl.Out[pl.Tensor[[ROWS, N], pl.FP32]]):
    r = pl.tile.get_block_idx()
    out[r : r + 1, :] = pl.mul(x[r : r + 1, :], 2.0)
    return out


@pl.jit.inline
def doubled(x, out):
    out, _task = pl.spmd_submit(self.double_row, x, out, core_num=ROWS)  # noqa: F821 - the program namespace
    return out


@pl.jit
def program_self(x: pl.Tensor[[ROWS, N], pl.FP32], out: pl.Out[pl.Tensor[[ROWS, N], pl.FP32]]):
    out = doubled(x, out)
    return out


@pl.jit
def missing_helper(x: pl.Tensor[[ROWS, N], pl.FP32], out: pl.Out[pl.Tensor[[ROWS, N], pl.FP32]]):
    out, _task = pl.spmd_submit(self.no_such_helper, x, out, core_num=ROWS)  # noqa: F821
    return out


@pytest.mark.parametrize("executor", ["reference", "compiled"])
def test_self_names_a_function_of_the_kernels_module(executor):
    x, out = torch.randn(ROWS, N), torch.zeros(ROWS, N)
    with config.scope(EXECUTOR=executor):
        program_self(x, out)
    assert torch.equal(out, x * 2)


@pytest.mark.parametrize("executor", ["reference", "compiled"])
def test_a_missing_program_function_is_named(executor):
    with config.scope(EXECUTOR=executor), pytest.raises(DSLError, match="self.no_such_helper: the program has no "
                                                                        "function 'no_such_helper'"):
        missing_helper(torch.randn(ROWS, N), torch.zeros(ROWS, N))
