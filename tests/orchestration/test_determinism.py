"""PYPTO_DETERMINISTIC=1: atomic adds into a target land in program order (tasks, then blocks), whatever order the
tasks finish in, on the engine, in kernel replays and in whole-run replays alike."""
from __future__ import annotations

import hashlib
import threading
import time

import pytest
import torch

import pypto.language as pl
import pypto_rt
from pypto_rt import config
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import AtomicType
from pypto_rt.orchestration.atomic_order import AtomicOrder
from pypto_rt.ops import views
from pypto_rt.ops.value import TensorValue
from pypto_rt.replay.capture import Recorder
from pypto_rt.replay.records import text

M, K, N, SPLITS = 8, 1024, 16, 8
K_TILE = K // SPLITS


@pl.jit
def split_k(a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32], c: pl.InOut[pl.Tensor[[M, N], pl.FP32]]):
    with pl.spmd(SPLITS, name_hint="split_k"):
        k = pl.get_block_idx()
        part = pl.matmul(a[:, k * K_TILE : (k + 1) * K_TILE], b[k * K_TILE : (k + 1) * K_TILE, :],
                         out_dtype=pl.FP32)
        c = pl.assemble(c, part, [0, 0], atomic=pl.AtomicType.Add)
    return c


def _split_k_bits(runs: int, **knobs) -> list[str]:
    torch.manual_seed(0)
    a, b = torch.randn(M, K) * 100, torch.randn(K, N)
    out = []
    with config.scope(**knobs):
        for _ in range(runs):
            c = torch.zeros(M, N)
            split_k(a, b, c)
            out.append(hashlib.sha1(c.numpy().tobytes()).hexdigest())
    return out


def test_split_k_is_bit_identical_run_to_run_and_to_one_worker(capfd):
    one_worker = _split_k_bits(1, NUM_WORKERS="1", REPLAY="0", KERNEL_REPLAY="0")
    # engine runs only, then the defaults: kernel replays, a whole-run recording, its replays and engine trials
    on_engine = _split_k_bits(12, NUM_WORKERS="4", DETERMINISTIC="1", REPLAY="0", STATS="1")
    defaults = _split_k_bits(12, NUM_WORKERS="4", DETERMINISTIC="1", STATS="1")
    assert set(on_engine) == set(defaults) == set(one_worker)
    stats = capfd.readouterr().err
    assert "block recorded" in stats and "replay of" in stats   # both kinds of replay took part


DELAY_S = 0.05
VALUES = (1.0, 1e8, -1e8)   # FP32: added in this order 0.0; in reverse order 1.0


HOLD_DEADLINE_S = 30.0
_first_task_hold: threading.Event | None = None   # set: the first block (task) waits for it (see `_holding_...`)


def finish_in_reverse(i):
    time.sleep(DELAY_S * (len(VALUES) - 1 - int(i)))   # the first block (task) finishes last
    hold = _first_task_hold
    if hold is not None and int(i) == 0:
        assert hold.wait(HOLD_DEADLINE_S), "the host never submitted the third task"


@pl.jit
def blocks_in_reverse(v: pl.Tensor[[3, N], pl.FP32], c: pl.InOut[pl.Tensor[[1, N], pl.FP32]]):
    with pl.spmd(3, name_hint="add_block"):
        i = pl.get_block_idx()
        finish_in_reverse(i)
        c = pl.assemble(c, v[i : i + 1, :], [0, 0], atomic=pl.AtomicType.Add)
    return c


@pl.jit.inline
def add_row(c, v, i):
    finish_in_reverse(i)
    return pl.assemble(c, v[i : i + 1, :], [0, 0], atomic=pl.AtomicType.Add)


@pl.jit
def helper_blocks_in_reverse(v: pl.Tensor[[3, N], pl.FP32], c: pl.InOut[pl.Tensor[[1, N], pl.FP32]]):
    with pl.spmd(3, name_hint="add_block"):
        add_row(c, v, pl.get_block_idx())   # the atomic add is the helper's
    return c


@pl.jit
def helper_tasks_in_reverse(v: pl.Tensor[[3, N], pl.FP32], c: pl.InOut[pl.Tensor[[1, N], pl.FP32]]):
    with pl.manual_scope():
        for i in pl.range(3):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_task"):
                add_row(c, v, i)
    return c


@pl.jit
def tasks_in_reverse(v: pl.Tensor[[3, N], pl.FP32], c: pl.InOut[pl.Tensor[[1, N], pl.FP32]]):
    with pl.manual_scope():   # no edges from the tensor map: the three tasks run at once
        for i in pl.range(3):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_task"):
                finish_in_reverse(i)
                c = pl.assemble(c, v[i : i + 1, :], [0, 0], atomic=pl.AtomicType.Add)
    return c


def _values() -> torch.Tensor:
    return torch.tensor(VALUES).reshape(3, 1).expand(3, N).contiguous()


def _in_program_order() -> torch.Tensor:
    c = torch.zeros(1, N)
    for row in _values():
        c += row
    return c


def test_blocks_finishing_in_reverse_add_in_block_order():
    c = torch.zeros(1, N)
    with config.scope(NUM_WORKERS="3", DETERMINISTIC="1"):
        blocks_in_reverse(_values(), c)
    assert torch.equal(c, _in_program_order())   # (without the mode: 1.0, the reverse order's sum)
    one = torch.zeros(1, N)
    with config.scope(NUM_WORKERS="1"):
        blocks_in_reverse(_values(), one)
    assert torch.equal(c, one)


@pytest.mark.parametrize("kernel", [helper_blocks_in_reverse, helper_tasks_in_reverse])
def test_atomic_adds_made_by_a_helper_kernel_are_ordered_too(kernel):
    c = torch.zeros(1, N)
    with config.scope(NUM_WORKERS="3", DETERMINISTIC="1"):
        kernel(_values(), c)
    assert torch.equal(c, _in_program_order())


def _holding_the_first_task_until_all_are_noted(monkeypatch) -> None:
    """An edge is made only to an unfinished task, so on a slow host (the first task done before the second is
    submitted) there would be fewer: the first task waits until the host has noted all three adds."""
    hold, noted, note = threading.Event(), [], AtomicOrder.note

    def noting(self, task, regions):
        note(self, task, regions)
        noted.append(task)
        if len(noted) == len(VALUES):
            hold.set()
    monkeypatch.setattr(AtomicOrder, "note", noting)
    monkeypatch.setattr(f"{__name__}._first_task_hold", hold)


def test_manual_scope_tasks_get_atomic_order_edges_and_add_in_program_order(capfd, monkeypatch):
    with config.scope(NUM_WORKERS="3", STATS="1"):
        tasks_in_reverse(_values(), torch.zeros(1, N))
    assert "atomic order" not in capfd.readouterr().err   # by default they run unordered
    c = torch.zeros(1, N)
    _holding_the_first_task_until_all_are_noted(monkeypatch)
    with config.scope(NUM_WORKERS="3", STATS="1", DETERMINISTIC="1"):
        tasks_in_reverse(_values(), c)
    assert "explicit 0, atomic order 2)" in capfd.readouterr().err   # task 1 after task 0, task 2 after task 1 only
    assert torch.equal(c, _in_program_order())


@pl.jit
def plain_writes(v: pl.Tensor[[3, N], pl.FP32], c: pl.InOut[pl.Tensor[[1, N], pl.FP32]]):
    with pl.manual_scope():
        for i in pl.range(3):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="write_task"):
                c = pl.assemble(c, v[i : i + 1, :], [0, 0], atomic=pl.AtomicType.None_)
    return c


def test_atomic_none_is_a_plain_write_and_gets_no_atomic_order(capfd):
    with config.scope(NUM_WORKERS="3", STATS="1", DETERMINISTIC="1"):
        plain_writes(_values(), torch.zeros(1, N))
    assert "atomic order" not in capfd.readouterr().err


def test_a_recording_takes_an_atomic_add_as_one_call():
    # a replayed block (or run) must add through atomic_add_ too: atomically, or kept for ordering
    target, tile = torch.zeros(2, 4), torch.ones(2, 4)
    with Recorder([target, tile]) as rec:
        views.assemble(TensorValue(target, D.FP32), TensorValue(tile, D.FP32), [0, 0], atomic=AtomicType.Add)
    calls = [text(call.code) for call in rec.recorded]
    assert sum(call.startswith("atomicadd_") for call in calls) == 1
    assert not any("add_" in call for call in calls if not call.startswith("atomicadd_"))


def test_the_python_setter_sets_the_knob(monkeypatch):
    monkeypatch.delenv("PYPTO_DETERMINISTIC", raising=False)
    assert not pypto_rt.are_deterministic_algorithms_enabled()
    pypto_rt.use_deterministic_algorithms(True)
    assert pypto_rt.are_deterministic_algorithms_enabled()
    pypto_rt.use_deterministic_algorithms(False)
    assert not pypto_rt.are_deterministic_algorithms_enabled()
