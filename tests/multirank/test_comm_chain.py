"""The per-rank program-order chain of communication tasks, seen in the task graph (no launcher: one rank).

Which kernels communicate is decided at compile time (`communicates`); which tasks join the chain also counts
window inputs. The chain test runs one rank in a forked child (the collective test harness) and records what the
host submits to the engine (the graph the engine keeps drops edges to producers already done, so it would race).
"""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.orchestration.host import communicates
from pypto_rt.orchestration.program import host_program
from tests.collective.harness import run_ranks

N = 8


@pl.jit.inline
def waits_in_helper(signal: pld.DistributedTensor[[1, 1], pl.INT32]):
    pld.system.wait(signal=signal, offsets=[0, 0], expected=1, cmp=pld.WaitCmp.Ge)


@pl.jit.inline
def computes_in_helper(x: pl.Tensor[[N, N], pl.FP32]):
    return pl.exp(pl.load(x, [0, 0], [N, N]))


@pl.jit.inline
def submits_a_wait(signal: pld.DistributedTensor[[1, 1], pl.INT32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="wait_self"):
        pld.system.wait(signal=signal, offsets=[0, 0], expected=1, cmp=pld.WaitCmp.Ge)
    return signal


@pl.jit
def kinds(
    x: pl.Tensor[[N, N], pl.FP32],
    y: pl.Out[pl.Tensor[[N, N], pl.FP32]],
    signal: pld.DistributedTensor[[1, 1], pl.INT32],
):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="direct_op"):
        pld.system.notify(signal, peer=0, offsets=[0, 0], value=1)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="through_helper"):
        waits_in_helper(signal)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="compute_helper"):
        y = pl.store(computes_in_helper(x), [0, 0], y)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="compute"):
        y = pl.store(pl.add(pl.load(x, [0, 0], [N, N]), 1.0), [0, 0], y)
    return y


def test_a_kernel_communicates_when_it_or_a_helper_kernel_calls_a_pld_op():
    found = {k.ir.display: communicates(k) for k in host_program(kinds).kernels}
    assert found == {"direct_op": True, "through_helper": True, "compute_helper": False, "compute": False}


@pl.jit
def chained(
    x: pl.Tensor[[N, N], pl.FP32],
    y: pl.Out[pl.Tensor[[N, N], pl.FP32]],
    z: pl.Out[pl.Tensor[[N, N], pl.FP32]],
    data: pld.DistributedTensor[[N, N], pl.FP32],
    signal: pld.DistributedTensor[[1, 1], pl.INT32],
):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="fill"):          # a window input, no pld op
        data = pl.store(pl.load(x, [0, 0], [N, N]), [0, 0], data)
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="notify_self"):
            pld.system.notify(signal, peer=0, offsets=[0, 0], value=1)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="compute"):       # no window, no pld op: not chained
        z = pl.store(pl.add(pl.load(x, [0, 0], [N, N]), 1.0), [0, 0], z)
    submits_a_wait(signal)                                            # an inline call's region
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="read_back"):
        y = pl.store(pld.tile.remote_load(data, peer=0, offsets=[0, 0], shape=[N, N]), [0, 0], y)
    return y


def _one_rank(rank):
    from pypto_rt.aicpu import Engine
    from pypto_rt.collective import process

    submitted = []
    submit = Engine.submit

    def recording(self, name, run, accesses=(), *, deps=(), **kwargs):
        submitted.append((name, [d.name for d in deps or ()], len(accesses)))
        return submit(self, name, run, accesses, deps=deps, **kwargs)

    Engine.submit = recording   # a forked child of its own: nothing to restore
    process.install(rank.comm())
    try:
        data = pld.window(pld.alloc_window_buffer([N, N], dtype=pl.FP32), [N, N], dtype=pl.FP32)
        signal = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
        x = torch.arange(N * N, dtype=torch.float32).reshape(N, N)
        y, z = torch.zeros(N, N), torch.zeros(N, N)
        chained(x, y, z, data, signal)
        assert torch.equal(y, x) and torch.equal(z, x + 1)
    finally:
        process.close()
    return submitted


@pytest.mark.timeout(60)
def test_communication_tasks_form_a_chain_in_program_order_and_windows_make_no_tensor_map_accesses():
    submitted = run_ranks(_one_rank, 1, env={"PYPTO_NUM_WORKERS": "2"}).ok()[0]
    # (task, explicit deps, tensor-map accesses): each task touching a window or calling a pld op depends on
    # the previous one, through a manual scope and an inline call; windows (data, signal) make no accesses
    assert submitted == [("fill", [], 1),                      # x
                         ("notify_self", ["fill"], 0),
                         ("compute", [], 2),                   # x, z
                         ("wait_self", ["notify_self"], 0),
                         ("read_back", ["wait_self"], 1)]      # y
