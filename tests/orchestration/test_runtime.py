"""The compiled runtime as kernel authors depend on it: ordering, parallelism, failures, traces, checks, dumps."""
from __future__ import annotations

import json
import threading
import time
import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.aicpu import TaskFailedError
from pypto_rt.ops import OPS
from pypto_rt.orchestration.task_runner import CheckMismatchError

N = 16


def slow_down():
    time.sleep(0.05)


@pl.jit
def cache_roundtrip(new: pl.Tensor[[4, N], pl.FP32], cache: pl.InOut[pl.Tensor[[4, 4, N], pl.FP32]],
                    out: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    flat = pl.reshape(cache, [16, N])
    with pl.spmd(4, name_hint="write_rows"):
        b = pl.get_block_idx()        # the row is computed inside the kernel: the writer's region is the whole cache
        slow_down()
        flat[b * 4 + 1 : b * 4 + 2, :] = pl.add(new[b : b + 1, :], 0.0)
    rows = pl.reshape(cache, [4, 4 * N])
    for r in pl.parallel(4):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="read_rows"):
            out[r : r + 1, :] = pl.add(rows[r : r + 1, N : 2 * N], 0.0)
    return out


def test_reader_through_another_reshaped_view_waits_for_a_writer_with_in_kernel_offsets():
    new = torch.randn(4, N)
    cache = torch.zeros(4, 4, N)
    out = torch.zeros(4, N)
    with config.scope(NUM_WORKERS="2"):
        cache_roundtrip(new, cache, out)
    assert torch.equal(out, new)
    assert torch.equal(cache[:, 1, :], new)


BARRIER = threading.Barrier(2)


def meet():
    BARRIER.wait(timeout=10)


@pl.jit
def rendezvous(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    for r in pl.parallel(0, N, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="meet"):
            meet()   # returns only when both row tiles run at the same time
            y[r : r + 8, :] = pl.add(x[r : r + 8, :], 1.0)
    return y


def test_tasks_writing_disjoint_tiles_of_one_tensor_run_in_parallel():
    BARRIER.reset()
    x = torch.randn(N, N)
    y = torch.zeros(N, N)
    with config.scope(NUM_WORKERS="2"):
        rendezvous(x, y)
    assert torch.equal(y, x + 1.0)


@pl.jit
def breaks_midway(x: pl.Tensor[[N, N], pl.FP32], w: pl.Tensor[[8, N], pl.FP32],
                  y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    h = pl.create_tensor([N, N], dtype=pl.FP32)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="bad_matmul"):
        h = pl.assemble(h, pl.matmul(x, w), [0, 0])   # [16, 16] @ [8, 16]: shapes do not chain
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="after"):
        y[:, :] = pl.add(h, 1.0)
    return y


def test_a_failing_task_ends_the_run_naming_the_region_and_the_users_line():
    start = time.monotonic()
    with pytest.raises(TaskFailedError) as info:
        breaks_midway(torch.randn(N, N), torch.randn(8, N), torch.zeros(N, N))
    assert time.monotonic() - start < 100   # at the failure, not at the 300 s stall deadline (generous)
    message = str(info.value)
    assert "bad_matmul" in message and "pl.matmul" in message
    assert info.value.span.file == __file__
    assert info.value.span.line == breaks_midway.fn.__code__.co_firstlineno + 5


@pl.jit
def two_stages(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    h = pl.create_tensor([N, N], dtype=pl.FP32)
    for r in pl.parallel(0, N, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage1"):
            h = pl.assemble(h, pl.mul(x[r : r + 8, :], 2.0), [r, 0])
    for r in pl.parallel(0, N, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage2"):
            y[r : r + 8, :] = pl.exp(h[r : r + 8, :])
    return y


@pl.jit
def two_slow_stages(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    h = pl.create_tensor([N, N], dtype=pl.FP32)
    for r in pl.parallel(0, N, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage1"):
            slow_down()   # still running when stage2 is submitted: the edges are in the graph
            h = pl.assemble(h, pl.mul(x[r : r + 8, :], 2.0), [r, 0])
    for r in pl.parallel(0, N, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage2"):
            y[r : r + 8, :] = pl.exp(h[r : r + 8, :])
    return y


def test_trace_has_one_slice_per_task_and_the_graph_has_the_raw_edges(tmp_path, capsys):
    path = tmp_path / "run.json"
    with config.scope(TRACE=str(path), STATS="1", NUM_WORKERS="2"):
        y = two_slow_stages(torch.randn(N, N), torch.zeros(N, N))
    assert y.shape == (N, N)
    events = json.loads(path.read_text())["traceEvents"]
    slices = sorted(e["name"] for e in events if e.get("ph") == "X")
    assert slices == ["stage1", "stage1", "stage2", "stage2"]
    graph = (tmp_path / "run.graph.dot").read_text()
    assert graph.count("RAW") == 2          # each stage2 tile reads exactly the stage1 tile it needs
    stats = capsys.readouterr().err
    assert "4 tasks" in stats and "RAW 2" in stats


def test_check_reference_passes_a_correct_program():
    x = torch.randn(N, N)
    with config.scope(CHECK="reference"):
        y = two_stages(x, torch.zeros(N, N))
    assert torch.allclose(y, torch.exp(2 * x))


def test_check_reference_names_the_first_region_that_differs():
    @pl.jit
    def program(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
        h = pl.create_tensor([N, N], dtype=pl.FP32)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            h = pl.assemble(h, pl.mul(x, 2.0), [0, 0])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="exponent"):
            y[:, :] = pl.exp(h)
        return y

    x, y = torch.randn(N, N), torch.zeros(N, N)
    exact_exp = OPS["exp"]
    OPS["exp"] = lambda t: _off_by_a_bit(exact_exp, t)
    try:
        program.compile(x, y)     # the compiled kernels bind the (miscompiled) exp now
    finally:
        OPS["exp"] = exact_exp
    with config.scope(CHECK="reference"), pytest.raises(TaskFailedError) as info:
        program(x, y)
    cause = info.value.task.error
    assert isinstance(cause, CheckMismatchError)
    assert "'exponent'" in cause.message and "'y'" in cause.message and "worst at" in cause.message
    assert cause.span.line == program.fn.__code__.co_firstlineno + 5


def _off_by_a_bit(exp, t):
    out = exp(t)
    out.data[3, 5] += 0.5
    return out


def test_dump_dir_holds_readable_host_and_kernel_code(tmp_path):
    two_stages.state.clear()
    with config.scope(DUMP_DIR=str(tmp_path)):
        two_stages(torch.randn(N, N), torch.zeros(N, N))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith(".host.py") for n in names) and sum(".kernel" in n for n in names) == 2
    host = next(p for p in tmp_path.iterdir() if p.name.endswith(".host.py")).read_text()
    assert "__rt.submit(__K[0]" in host and "pl.create_tensor" in host
    kernel = next(p for p in tmp_path.iterdir() if p.name.endswith(".kernel0.py")).read_text()
    assert "outlined from" in kernel and "__op_mul(" in kernel and "w h[r:+8, 0:+*]" in kernel


def test_writing_an_in_parameter_warns_at_the_writing_line():
    @pl.jit
    def scribbles(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scratch"):
            x[0:1, :] = pl.full([1, N], dtype=pl.FP32, value=0.0)
            y[:, :] = pl.add(x, 1.0)
        return y

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scribbles(torch.ones(N, N), torch.zeros(N, N))
    found = [w for w in caught if "an In parameter" in str(w.message)]
    assert len(found) == 1 and found[0].lineno == scribbles.fn.__code__.co_firstlineno + 3


@pl.jit
def inner_loop_reader(a: pl.InOut[pl.Tensor[[8, 32], pl.FP32]], out: pl.Out[pl.Tensor[[8, 1], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="fill_right_half"):
        slow_down()
        a[:, 16:32] = pl.full([8, 16], dtype=pl.FP32, value=1.0)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="sum_in_steps"):
        acc = pl.full([8, 1], dtype=pl.FP32, value=0.0)
        for k0 in pl.range(0, 32, 16):   # the offset is computed inside: the whole row range is read
            acc = pl.add(acc, pl.row_sum(a[:, k0 : k0 + 16]))
        out[:, :] = acc
    return out


def test_an_inner_loop_offset_reads_the_whole_dimension():
    inner_loop_reader(torch.zeros(8, 32), torch.zeros(8, 1))   # warm: first-run costs must not order the tasks
    a, out = torch.zeros(8, 32), torch.zeros(8, 1)
    with config.scope(NUM_WORKERS="2"):
        inner_loop_reader(a, out)
    assert torch.equal(out, torch.full((8, 1), 16.0))


@pl.jit
def manual_chain(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    h = pl.create_tensor([4, N], dtype=pl.FP32)
    tids = pl.array.create(4, pl.TASK_ID)
    with pl.manual_scope():
        for r in pl.range(4):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="produce") as tid:
                slow_down()
                h = pl.assemble(h, pl.mul(x[r : r + 1, :], 2.0), [r, 0])
            tids[r] = tid
        done = pl.system.task_dummy(deps=tids)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="consume", deps=[done]):
            y[:, :] = pl.add(h, 1.0)   # in a manual scope only deps= orders this after the producers
    return y


def test_manual_scope_orders_by_explicit_deps_task_ids_and_a_dummy_join(tmp_path):
    x = torch.randn(4, N)
    path = tmp_path / "manual.json"
    with config.scope(NUM_WORKERS="2", TRACE=str(path)):
        y = manual_chain(x, torch.zeros(4, N))
    assert torch.equal(y, x * 2.0 + 1.0)
    graph = (tmp_path / "manual.graph.dot").read_text()
    assert "RAW" not in graph and graph.count('label="dep"') == 5   # 4 producers -> join -> consumer


@pl.jit
def quick_step(x: pl.Tensor[[8, N], pl.FP32], y: pl.Out[pl.Tensor[[8, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="quick"):
        y[:, :] = pl.add(x, 1.0)
    return y


def test_a_kernel_known_to_be_short_runs_on_the_host_thread(tmp_path):
    x = torch.randn(8, N)
    quick_step(x, torch.zeros(8, N))   # a first run (on a worker) teaches the runtime how long this kernel takes
    path = tmp_path / "quick.json"
    with config.scope(TRACE=str(path), NUM_WORKERS="2", HOST_INLINE_US="10000000"):   # "short": under 10 s
        y = quick_step(x, torch.zeros(8, N))
    assert torch.equal(y, x + 1.0)
    lanes = {e["tid"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"}
    assert lanes == {2}   # lane 2 of 2 workers: the orchestrator's own lane
    with config.scope(TRACE=str(path), NUM_WORKERS="2", HOST_INLINE_US="0"):
        quick_step(x, torch.zeros(8, N))
    lanes = {e["tid"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"}
    assert lanes <= {0, 1}


@pl.jit
def host_reads_an_element(x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[1, 1], pl.FP32]]):
    h = pl.create_tensor([4, N], dtype=pl.FP32)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="slow_fill"):
        slow_down()
        h = pl.assemble(h, pl.add(x, 1.0), [0, 0])
    first = h[2, 3]   # on the host: waits for exactly the task writing that element
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="store"):
        y[:, :] = pl.full([1, 1], dtype=pl.FP32, value=first)
    return y


def test_a_host_subscript_of_one_element_waits_for_its_producer():
    x = torch.randn(4, N)
    with config.scope(NUM_WORKERS="2", HOST_INLINE_US="0"):
        y = host_reads_an_element(x, torch.zeros(1, 1))
    assert y.item() == pytest.approx(x[2, 3].item() + 1.0)


@pl.jit
def gather_rows(x: pl.Tensor[[N, N], pl.FP32], rows: pl.Tensor[[4], pl.INT32],
                y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    for i in pl.range(4):
        row = pl.read(rows, [i])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_row"):
            first = pl.read(x, [row, 0])   # out of range: the task fails
            y[i : i + 1, :] = pl.add(x[row : row + 1, :], first)   # short: runs at once when nothing is in flight
    return y


def test_short_tasks_run_at_once_between_host_reads_and_still_fail_with_a_report():
    x = torch.randn(N, N)
    with config.scope(HOST_INLINE_US="10000000", REPLAY="0"):
        for picks in ([0, 1, 2, 3], [5, 5, 0, 7], [N - 1, 2, 9, 4]):
            y = gather_rows(x, torch.tensor(picks, dtype=torch.int32), torch.zeros(4, N))
            assert torch.equal(y, x[picks] + x[picks, :1]), picks
        with pytest.raises(TaskFailedError) as info:
            gather_rows(x, torch.tensor([0, N + 5, 1, 2], dtype=torch.int32), torch.zeros(4, N))
    assert "copy_row" in str(info.value)
    assert info.value.span.file == __file__
