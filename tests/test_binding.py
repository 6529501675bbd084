"""Binding entry arguments: calls specialise on the shapes passed (as the real @pl.jit), tensors without data or
with self-overlapping outputs are refused at the call."""
from __future__ import annotations

import sys
import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.errors import EntryShapeWarning, KernelArgumentError, PyptoError

N = 8
EXECUTORS = ["compiled", "reference"]


def make_rows_exp():
    """A fresh kernel (its own once-per-shape warning memory) annotated [4, N], whose loop runs over x's rows."""
    @pl.jit
    def rows_exp(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        rows = x.shape[0]
        for r in pl.parallel(rows):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="exp"):
                y[r : r + 1, :] = pl.exp(x[r : r + 1, :])
        return y
    return rows_exp


def make_four_rows():
    """Annotated [4, N] and assuming it: a constant loop of 4 rows."""
    @pl.jit
    def four_rows(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        for r in pl.parallel(4):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy"):
                t = pl.load(x, [r, 0], [1, N])
                pl.store(t, [r, 0], y)   # STORE
        return y
    return four_rows


def shape_warnings(caught) -> list:
    return [w for w in caught if issubclass(w.category, EntryShapeWarning)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("rows", [1, 6])
def test_a_call_runs_for_the_shape_passed_and_warns_at_the_call(executor, rows):
    kernel = make_rows_exp()
    x, y = torch.randn(rows, N), torch.zeros(rows, N)
    with config.scope(EXECUTOR=executor), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        kernel(x, y)
    assert torch.equal(y, torch.exp(x))
    (w,) = shape_warnings(caught)
    assert (w.filename, w.lineno) == (__file__, line)
    assert f"'x' has shape [{rows}, {N}] (annotated [4, {N}], axis 0 differs)" in str(w.message)


def test_the_warning_comes_once_per_kernel_and_shape():
    kernel = make_rows_exp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (1, 1, 6, 4, 1, 6):
            kernel(torch.randn(rows, N), torch.zeros(rows, N))
    assert [str(w.message).split("'x' has shape ")[1][:6] for w in shape_warnings(caught)] == ["[1, 8]", "[6, 8]"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_rows_exp()(torch.randn(1, N), torch.zeros(1, N))   # another kernel: its own warning
    assert len(shape_warnings(caught)) == 1


def test_every_cache_keys_on_the_shapes_passed():
    """Engine runs, the recorded run, replays (of the call and of kernel blocks) and the disk cache's program: each
    shape gets its own results, the annotated one included, whichever shape came first."""
    from pypto_rt.orchestration.program import host_program
    from pypto_rt.orchestration.task_runner import kernel_replays
    from pypto_rt.replay.entry import decisions
    from pypto_rt.replay.policy import policy_scope
    kernel = make_rows_exp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EntryShapeWarning)
        # every block after the first replays
        with config.scope(REPLAY="0", COALESCE="0"), policy_scope(kernel_normal_runs=0, kernel_slower=float("inf")):
            for _ in range(3):
                for rows in (6, 4, 1):
                    x, y = torch.randn(rows, N), torch.zeros(rows, N)
                    kernel(x, y)
                    assert torch.equal(y, torch.exp(x)), rows
            # (inside the scope: a program is compiled for the PYPTO_COALESCE in force)
            assert len(kernel_replays(host_program(kernel).kernels[0]).states()) == 3
        kernel.state.clear()
        for _ in range(5):
            for rows in (1, 4, 6):
                x, y = torch.randn(rows, N), torch.zeros(rows, N)
                kernel(x, y)
                assert torch.equal(y, torch.exp(x)), rows
        assert len(decisions(kernel)) == 3
        kernel.state.clear()   # this process forgets it all: the program comes from the disk cache
        for rows in (4, 6, 1):
            x, y = torch.randn(rows, N), torch.zeros(rows, N)
            kernel(x, y)
            assert torch.equal(y, torch.exp(x)), rows


@pytest.mark.parametrize("executor", EXECUTORS)
def test_code_assuming_the_annotated_extent_fails_at_its_op(executor):
    kernel = make_four_rows()
    store_line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# STORE"))
    with config.scope(EXECUTOR=executor), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(PyptoError, match="runs past the target") as info:
            kernel(torch.randn(2, N), torch.zeros(2, N))
    assert (info.value.span.file, info.value.span.line) == (__file__, store_line)
    assert len(shape_warnings(caught)) == 1


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_rank_other_than_annotated_runs_and_fails_at_the_op_that_needs_it(executor):
    """As the real @pl.jit (its parameter types are rebuilt from the tensors passed): no error at the call."""
    kernel = make_rows_exp()
    with config.scope(EXECUTOR=executor), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, y = torch.randn(4, N, 1), torch.zeros(4, N, 1)
        kernel(x, y)
        assert torch.equal(y, torch.exp(x))
        with pytest.raises(PyptoError, match="2 indices for a rank-1 value") as info:
            kernel(torch.randn(4 * N), torch.zeros(4 * N))
    assert info.value.span.file == __file__ and "pl.exp(x[r : r + 1, :])" in open(__file__).readlines()[
        info.value.span.line - 1]
    messages = [str(w.message) for w in shape_warnings(caught)]
    assert len(messages) == 2 and f"'x' has shape [{4 * N}] (rank 1, annotated [4, {N}])" in messages[1]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_dtype_other_than_annotated_stays_an_error(executor):
    kernel = make_rows_exp()
    with config.scope(EXECUTOR=executor), pytest.raises(KernelArgumentError, match="has dtype torch.int32") as info:
        kernel(torch.zeros(1, N, dtype=torch.int32), torch.zeros(1, N))
    assert info.value.span.file == __file__


@pl.jit
def add_one(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="add"):
        y[:, :] = pl.add(x[:, :], 1.0)
    return y


@pl.jit
def accumulate(x: pl.Tensor[[4, N], pl.FP32], acc: pl.InOut[pl.Tensor[[4, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="acc"):
        acc[:, :] = pl.add(acc[:, :], x[:, :])
    return acc


def warmed_up(kernel):
    """The kernel after enough calls that the next one with the same arguments replays without binding."""
    for _ in range(6):
        kernel(torch.zeros(4, N), torch.zeros(4, N))
    assert kernel.state.replay_by_arguments
    return kernel


@pytest.mark.parametrize("layout", ["to_sparse", "to_sparse_csr"])
def test_a_sparse_tensor_is_refused_at_the_call_even_after_replays(layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # torch: "sparse CSR support is in beta"
        sparse = getattr(torch.eye(4, N), layout)()
        for kernel in (add_one, warmed_up(add_one)):
            with pytest.raises(KernelArgumentError, match="argument 'x' is a sparse tensor") as info:
                kernel(sparse, torch.zeros(4, N))
            assert info.value.span.file == __file__ and info.value.hint == "pass x.to_dense()"


@pytest.mark.parametrize("which", [0, 1])
def test_a_meta_tensor_is_refused_at_the_call(which):
    args = [torch.zeros(4, N), torch.zeros(4, N)]
    args[which] = torch.empty(4, N, device="meta")
    with pytest.raises(KernelArgumentError, match="is a meta tensor: it has a shape but no data") as info:
        add_one(*args)
    assert info.value.span.file == __file__


@pytest.mark.parametrize("kernel,wrapper", [(add_one, "pl.Out"), (accumulate, "pl.InOut")])
def test_an_output_whose_elements_share_memory_is_refused_at_the_call(kernel, wrapper):
    out = torch.zeros(N).expand(4, N)
    with pytest.raises(KernelArgumentError, match=rf"'y' is written by the kernel \({wrapper}\)|'acc' is written "
                       rf"by the kernel \({wrapper}\)") as info:
        kernel(torch.zeros(4, N), out)
    assert "strides [0, 1]" in info.value.message and info.value.span.file == __file__


def test_an_expanded_input_is_fine():
    x, y = torch.arange(N, dtype=torch.float32).expand(4, N), torch.zeros(4, N)
    add_one(x, y)
    assert torch.equal(y, x + 1)
