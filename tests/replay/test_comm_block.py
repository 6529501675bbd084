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


def _alternating_windows(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        world = pld.world_size()
        pairs = [(pld.window(pld.alloc_window_buffer([R, D], dtype=pl.FP32), [R, D], dtype=pl.FP32),
                  pld.window(pld.alloc_window_buffer([world, 2], dtype=pl.INT32), [world, 2], dtype=pl.INT32))
                 for _ in range(2)]
        reasons = []
        for call in range(POLICY.normal_runs + 5):
            # both pairs have the same shapes: one specialisation, replayed on either pair's windows
            reasons.append(_ring_sum_call(rank.rank, call, *pairs[call % 2]))
        return reasons, [int(signal[(rank.rank - 1) % world, 0]) for _, signal in pairs]
    finally:
        process.close()


@pytest.mark.timeout(60)
def test_a_replay_signals_on_the_windows_it_is_given():
    for rank, (reasons, epochs) in run_ranks(_alternating_windows, 2, deadline_s=40).ok().items():
        assert "replay of" in reasons[-1] and "called as they are" not in reasons[-1], reasons
        calls = POLICY.normal_runs + 5   # the peer's last notify on each pair: its epoch (call + 1)
        assert epochs == [calls - 1, calls] if calls % 2 == 0 else [calls, calls - 1], (rank, epochs)


@pl.jit
def notify_peer_from_data(rows: pl.Tensor[[ROWS, D], pl.FP32], meta: pl.Tensor[[2], pl.INT32],
                          out: pl.Out[pl.Tensor[[ROWS, D], pl.FP32]], flag: pld.DistributedTensor[[1, 1], pl.INT32]):
    rows.bind_dynamic(0, ROWS)
    out.bind_dynamic(0, ROWS)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="notify_peer"):
        peer = pl.read(meta, [1])   # a peer read from data: code of the recorded notify
        pld.system.notify(flag, peer=peer, offsets=[0, 0], value=pl.read(meta, [0]), op=pld.NotifyOp.Set)
        out[:, :] = pl.add(rows, 1.0)
    return out


@pl.jit
def load_from_peer(rows: pl.Tensor[[ROWS, D], pl.FP32], meta: pl.Tensor[[2], pl.INT32],
                   out: pl.Out[pl.Tensor[[ROWS, D], pl.FP32]], flag: pld.DistributedTensor[[1, 1], pl.INT32]):
    rows.bind_dynamic(0, ROWS)
    out.bind_dynamic(0, ROWS)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="load_peer"):
        pld.system.notify(flag, peer=0, offsets=[0, 0], value=pl.read(meta, [0]), op=pld.NotifyOp.Set)
        seen = pld.tile.remote_load(flag, peer=0, offsets=[0, 0], shape=[1, 1])   # no recorded form
        out[:, :] = pl.add(rows, 1.0)
    return out


def _one_rank_calls(kernel, sizes: tuple, calls: int):
    def run(rank):
        from pypto_rt.collective import process

        process.install(rank.comm())
        try:
            flag = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
            runs = {}
            for n in sizes:   # specialisations of one kernel
                runs[n] = []
                for call in range(calls):
                    rows = torch.randn(n, D)
                    out = torch.zeros(n, D)
                    with run_stats.collect() as stats:
                        kernel(rows, torch.tensor([call + 7, 0], dtype=torch.int32), out, flag)
                    assert torch.equal(out, rows + 1.0) and int(flag[0, 0]) == call + 7, f"n={n}, call {call}"
                    runs[n].append((stats.replay.kind, stats.replay.reason))
            return runs
        finally:
            process.close()
    return run


@pytest.mark.timeout(60)
def test_a_peer_read_from_data_is_code_of_the_recorded_notify():
    runs = run_ranks(_one_rank_calls(notify_peer_from_data, (4,), POLICY.normal_runs + 3), 1, deadline_s=40).ok()[0]
    assert [k for k, _ in runs[4]] == [ENGINE] * POLICY.normal_runs + [RECORDED, REPLAYED, REPLAYED], runs
    assert "called as they are" not in runs[4][-1][1], runs[4][-1]


@pytest.mark.timeout(60)
def test_a_signal_op_it_cannot_record_falls_back_to_one_call_of_the_kernel_once_per_kernel():
    runs = run_ranks(_one_rank_calls(load_from_peer, (4, 2), POLICY.normal_runs + 4), 1, deadline_s=40).ok()[0]
    first, second = runs[4], runs[2]
    assert [k for k, _ in first] == [ENGINE] * (POLICY.normal_runs + 1) + [RECORDED, REPLAYED, REPLAYED], first
    assert "pld.tile.remote_load communicates" in first[POLICY.normal_runs][1], first[POLICY.normal_runs]
    assert "1 kernel blocks called as they are" in first[-1][1], first[-1]
    # a new specialisation of the same kernel calls it as it is from its first recording
    assert [k for k, _ in second] == [ENGINE] * POLICY.normal_runs + [RECORDED, REPLAYED, REPLAYED, REPLAYED], second
