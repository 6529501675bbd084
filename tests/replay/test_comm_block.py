"""Signalling blocks replayed as recorded calls (replay.comm_block): their `pld` ops as calls of their effects.

What users depend on: a decode step's signalling region replays without going through the op library (no block
called as it is), its epochs changing every call; a peer that never arrives inside such a replayed wait ends in the
multi-rank wait report naming it, in bounded time; what cannot be recorded op by op (a peer read from data) falls
back to one call of the kernel, saying why in the stats, once per kernel (not again for a new specialisation).
One or two ranks, forked (tests.collective.harness).
"""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt import run_stats
from pypto_rt.replay import entry as replay
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import ENGINE, RECORDED, REPLAYED
from tests.collective.harness import run_ranks
from tests.replay.test_comm_replay import _data, ring_sum

R, D = 8, 16
ROWS = pl.dynamic("ROWS")
POLICY = ReplayPolicy()


def _ring_sum_call(rank: int, call: int, inbox, signal) -> str:
    rows, _ = _data(rank, call)
    out = torch.zeros(R, D)
    with run_stats.collect() as stats:
        ring_sum(rows, torch.tensor([call + 1], dtype=torch.int32), out, inbox, signal)
    prev_rows, _ = _data((rank - 1) % pld.world_size(), call)
    assert torch.equal(out, prev_rows + rows), f"rank {rank}, call {call}: the sum differs from torch"
    return stats.replay.reason


def _rank_one_stops_early(rank):
    import os

    from pypto_rt.collective import process

    os.environ["PYPTO_TIMEOUT_S"] = "1" if rank.rank == 0 else "20"   # rank 1's exit waits for rank 0's failure
    process.install(rank.comm())
    try:
        inbox = pld.window(pld.alloc_window_buffer([R, D], dtype=pl.FP32), [R, D], dtype=pl.FP32)
        signal = pld.window(pld.alloc_window_buffer([2, 2], dtype=pl.INT32), [2, 2], dtype=pl.INT32)
        with policy_scope(normal_runs=1):   # call 1 on the engine, call 2 recorded, then replays
            for call in range(3):
                _ring_sum_call(rank.rank, call, inbox, signal)
            if rank.rank == 0:
                decision = replay.decisions(ring_sum)[0]
                assert decision.kind == REPLAYED and "called as they are" not in decision.reason, decision
                _ring_sum_call(0, 3, inbox, signal)   # rank 1 never comes: the recorded wait times out
        return "done"
    finally:
        process.close()


@pytest.mark.timeout(60)
def test_a_recorded_wait_timing_out_inside_a_replay_gives_the_multi_rank_wait_report():
    outcome = run_ranks(_rank_one_stops_early, 2, deadline_s=40)
    assert outcome.results.get(1) == "done", outcome
    error = outcome.errors[0]
    wait = error.get("wait")
    assert wait, error
    assert (wait["rank"], wait["label"], list(wait["cell"]), wait["expected"]) == (0, "ring_send", [1, 0], 4), wait
    assert wait["peers"] == [1], wait
    assert "rank 0 waits in `wait` (label ring_send) for cell [1, 0]" in error["text"], error["text"]
    assert "which rank 1 would set for 1.0 s" in error["text"], error["text"]


@pl.jit
def notify_peer_from_data(rows: pl.Tensor[[ROWS, D], pl.FP32], meta: pl.Tensor[[2], pl.INT32],
                          out: pl.Out[pl.Tensor[[ROWS, D], pl.FP32]], flag: pld.DistributedTensor[[1, 1], pl.INT32]):
    rows.bind_dynamic(0, ROWS)
    out.bind_dynamic(0, ROWS)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="notify_peer"):
        peer = pl.read(meta, [1])   # a peer read from data: a recorded signal op keeps its peer fixed
        pld.system.notify(flag, peer=peer, offsets=[0, 0], value=pl.read(meta, [0]), op=pld.NotifyOp.Set)
        out[:, :] = pl.add(rows, 1.0)
    return out


def _peer_from_data(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        flag = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
        runs = {}
        for n in (4, 2):   # two specialisations of one kernel
            runs[n] = []
            for call in range(POLICY.normal_runs + 4):
                rows = torch.randn(n, D)
                out = torch.zeros(n, D)
                with run_stats.collect() as stats:
                    notify_peer_from_data(rows, torch.tensor([call + 7, 0], dtype=torch.int32), out, flag)
                assert torch.equal(out, rows + 1.0) and int(flag[0, 0]) == call + 7, f"n={n}, call {call}"
                runs[n].append((stats.replay.kind, stats.replay.reason))
        return runs
    finally:
        process.close()


@pytest.mark.timeout(60)
def test_a_signal_op_it_cannot_record_falls_back_to_one_call_of_the_kernel_once_per_kernel():
    runs = run_ranks(_peer_from_data, 1, deadline_s=40).ok()[0]
    first, second = runs[4], runs[2]
    assert [k for k, _ in first] == [ENGINE] * (POLICY.normal_runs + 1) + [RECORDED, REPLAYED, REPLAYED], first
    assert "at a peer or offsets read from data" in first[POLICY.normal_runs][1], first[POLICY.normal_runs]
    assert "1 kernel blocks called as they are" in first[-1][1], first[-1]
    # a new specialisation of the same kernel calls it as it is from its first recording
    assert [k for k, _ in second] == [ENGINE] * POLICY.normal_runs + [RECORDED, REPLAYED, REPLAYED, REPLAYED], second
