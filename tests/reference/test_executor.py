"""The reference executor: program-order semantics kernels depend on, and argument checking."""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.errors import DSLError, InWriteWarning, KernelArgumentError, OpError

N = 8
T_DYN = pl.dynamic("T_DYN")


@pl.jit
def spmd_with_form(out: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    with pl.spmd(4, name_hint="fill") as tid:
        b = pl.tile.get_block_idx()
        out[b : b + 1, :] = pl.full([1, N], dtype=pl.FP32, value=pl.cast(b, pl.FP32) + 1.0)
    pl.system.task_dummy(deps=[tid])
    return out


def test_with_spmd_runs_the_body_once_per_block():
    out = torch.zeros(4, N)
    spmd_with_form(out)
    assert torch.equal(out, torch.arange(1, 5, dtype=torch.float32).reshape(4, 1).expand(4, N))


def make_closure_kernel(scale):
    @pl.jit
    def scaled(x: pl.Tensor[[2, N], pl.FP32], y: pl.Out[pl.Tensor[[2, N], pl.FP32]]):
        with pl.spmd(2):
            b = pl.get_block_idx()
            y[b : b + 1, :] = pl.mul(x[b : b + 1, :], scale)
        return y
    return scaled


def test_rewritten_kernel_sees_its_closure():
    x = torch.randn(2, N)
    y = torch.zeros(2, N)
    make_closure_kernel(3.0)(x, y)
    assert torch.allclose(y, x * 3.0)


@pl.jit
def carried_sum(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    acc0 = pl.full([1, N], dtype=pl.FP32, value=0.0)
    for i, (acc,) in pl.range(4, init_values=(acc0,)):
        nxt = pl.add(acc, x[i : i + 1, :])
        acc_out = pl.yield_(nxt)
    y[:, :] = acc_out
    return y


def test_init_values_and_yield_carry_state():
    x = torch.randn(4, N)
    y = torch.zeros(1, N)
    carried_sum(x, y)
    assert torch.allclose(y, x.sum(0, keepdim=True))


@pl.jit.inline
def write_rows(src: pl.Tensor[[4, N], pl.FP32], dst: pl.Tensor[[4, N], pl.FP32]):
    for r in pl.parallel(4):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy"):
            dst[r : r + 1, :] = pl.neg(src[r : r + 1, :])
    return dst


@pl.jit
def inline_caller(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    write_rows(x, y)
    return y


def test_inline_kernel_writes_through_to_the_entry_output():
    x = torch.randn(4, N)
    y = torch.zeros(4, N)
    inline_caller(x, y)
    assert torch.equal(y, -x)


def test_inline_kernel_cannot_be_an_entry():
    with pytest.raises(DSLError, match="@pl.jit.inline"):
        write_rows(torch.zeros(4, N), torch.zeros(4, N))


@pl.jit
def writes_its_input(x: pl.Tensor[[4, N], pl.FP32]):
    view = pl.reshape(x, [N, 4])
    view[0:1, :] = pl.full([1, 4], dtype=pl.FP32, value=1.0)
    return x


def test_writing_an_in_parameter_warns_once_at_the_user_line_even_through_a_view():
    x = torch.zeros(4, N)
    with pytest.warns(InWriteWarning, match="writes into 'x', an In parameter") as record:
        writes_its_input(x)
    assert len(record) == 1 and record[0].filename == __file__
    assert x.view(N, 4)[0].tolist() == [1.0] * 4  # on the CPU the scratch write lands


def test_golden_rejects_a_compared_output_annotated_in():
    from pypto_rt.golden import TensorSpec, run_jit

    specs = [TensorSpec("x", [4, N], torch.float32, is_output=True)]
    with pytest.raises(DSLError, match="'x' are compared by the golden but annotated In"):
        run_jit(fn=writes_its_input, specs=specs, golden_fn=lambda v: None)


@pl.jit
def dyn_rows(x: pl.Tensor[[T_DYN, N], pl.FP32], y: pl.Out[pl.Tensor[[T_DYN, N], pl.FP32]]):
    x.bind_dynamic(0, T_DYN)
    t = pl.tensor.dim(x, 0)
    for r in pl.range(t):
        y[r : r + 1, :] = pl.exp(x[r : r + 1, :])
    return y


def test_dynamic_dims_take_the_argument_extent():
    for t in (3, 5):
        x = torch.randn(t, N)
        y = torch.zeros(t, N)
        dyn_rows(x, y)
        assert torch.allclose(y, x.exp())


def test_return_style_allocates_missing_outputs():
    x = torch.randn(3, N)
    y = dyn_rows(x)
    assert torch.allclose(y, x.exp())


@pytest.mark.parametrize("args,message", [
    ((torch.zeros(3, N), torch.zeros(4, N)), "dynamic dim T_DYN is already 3"),
    ((torch.zeros(3, N, dtype=torch.int32), torch.zeros(3, N)), "has dtype torch.int32, the kernel expects pl.FP32"),
    (("not a tensor", torch.zeros(3, N)), "must be a torch.Tensor"),
])
def test_bad_entry_arguments_are_reported_at_the_call(args, message):
    with pytest.raises(KernelArgumentError, match=message) as info:
        dyn_rows(*args)
    assert info.value.span.file == __file__


def test_too_many_arguments():
    with pytest.raises(KernelArgumentError, match="too many positional arguments"):
        dyn_rows(torch.zeros(3, N), torch.zeros(3, N), torch.zeros(3, N))


@pl.jit
def misuses_an_op(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    y[0:4, :] = pl.row_expand_mul(x, x, x, x)
    return y


def test_wrong_op_arity_names_the_op_and_line():
    with pytest.raises(OpError, match="pl.row_expand_mul") as info:
        misuses_an_op(torch.zeros(4, N), torch.zeros(4, N))
    assert info.value.span.file == __file__


@pl.jit
def hints_are_no_ops(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    tids = pl.array.create(4, pl.TASK_ID)
    with pl.manual_scope():
        for r in pl.range(4):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="row", deps=[tids[r]],
                       optimizations=[pl.split(pl.SplitMode.UP_DOWN)]) as tid:
                y[r : r + 1, :] = pl.no_dep(x[r : r + 1, :])
            tids[r] = tid
    with pl.scope():
        pl.system.task_dummy(deps=[tids[0], tids[3]])
    return y


def test_scheduling_hints_do_not_change_results():
    x = torch.randn(4, N)
    y = torch.zeros(4, N)
    hints_are_no_ops(x, y)
    assert torch.equal(x, y)


@pl.jit.inline
def inline_with_out(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    y[:, :] = pl.abs(x)
    return y


@pl.jit
def calls_inline_with_out(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    inline_with_out(x, y)
    return y


def test_direction_wrapper_on_an_inline_parameter_warns_and_still_aliases():
    x = torch.randn(4, N)
    y = torch.zeros(4, N)
    with pytest.warns(DeprecationWarning, match="inline_with_out: pl.Out/pl.InOut on parameter"):
        calls_inline_with_out(x, y)
    assert torch.equal(y, x.abs())


@pl.jit
def copy_rows(x: pl.Tensor[[T_DYN, N], pl.FP32], y: pl.Out[pl.Tensor[[T_DYN, N], pl.FP32]]):
    x.bind_dynamic(0, T_DYN)
    y.bind_dynamic(0, T_DYN)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy"):
        y[:, :] = pl.add(x, 1.0)
    return y


@pytest.mark.parametrize("executor", ["reference", "compiled"])
def test_empty_tensors_alias_nothing(executor):
    """Zero-element tensors share data_ptr 0: writing an empty Out next to an empty In must not warn."""
    import warnings

    with config.scope(EXECUTOR=executor), warnings.catch_warnings():
        warnings.simplefilter("error", InWriteWarning)
        copy_rows(torch.zeros(0, N), torch.empty(0, N))
