"""Replay of entry calls that communicate: each block of a communication task is one opaque call of its kernel.

What users depend on (a serving engine calling a dispatch kernel every decode step with the same shapes): such a
call replays, with the epoch and the row count it reads from data changing every call, its results right every
call; numbers read from a window are never taken as unchanged since the call started; a wait that times out
inside a replay ends with the usual multi-rank wait report. Two ranks, forked (tests.collective.harness).
"""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt import run_stats
from pypto_rt.replay import entry as replay
from pypto_rt.replay.policy import policy_scope
from pypto_rt.run_stats import GUARD_MISS, REPLAYED
from tests.collective.harness import run_ranks

R, D = 8, 16
NR = pl.dynamic("NR")
CALLS = 12


@pl.jit
def pass_rows(
    rows: pl.Tensor[[R, D], pl.FP32],
    meta: pl.Tensor[[2], pl.INT32],              # [epoch, live rows this rank sends]
    out: pl.Out[pl.Tensor[[R, D], pl.FP32]],
    inbox: pld.DistributedTensor[[R, D], pl.FP32],
    count: pld.DistributedTensor[[1, 1], pl.INT32],
    signal: pld.DistributedTensor[[NR, 2], pl.INT32],   # [sender, 0]: rows sent; [receiver, 1]: rows taken
):
    signal.bind_dynamic(0, NR)
    epoch = pl.read(meta, [0])
    n = pl.read(meta, [1])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="pass_rows"):
        ctx = pld.get_comm_ctx(inbox)
        me = pld.rank(ctx)
        world = pld.nranks(ctx)
        nxt = (me + 1) % world
        prv = (me + world - 1) % world
        pld.tensor.put(dst=inbox, peer=nxt, src=rows, dst_offsets=[0, 0], src_offsets=[0, 0], shape=[R, D])
        pld.tile.remote_store(pl.full([1, 1], dtype=pl.INT32, value=n), target=count, peer=nxt, offsets=[0, 0])
        pld.system.notify(signal, peer=nxt, offsets=[me, 0], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[prv, 0], expected=epoch, cmp=pld.WaitCmp.Ge)
        live = pl.read(count, [0, 0])                     # the row count, read inside the region
        for i in pl.range(live):
            out = pl.store(pl.load(inbox, [i, 0], [1, D]), [i, 0], out)
        pld.system.notify(signal, peer=prv, offsets=[me, 1], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[nxt, 1], expected=epoch, cmp=pld.WaitCmp.Ge)
    return out


def _data(rank: int, call: int):
    """(rows, live rows) rank `rank` sends in call `call`: different every call, some calls none or all."""
    rows = torch.arange(R * D, dtype=torch.float32).reshape(R, D) + 1000 * rank + 100 * call
    return rows, (3 * call + 5 * rank) % (R + 1)


def _windows():
    inbox = pld.window(pld.alloc_window_buffer([R, D], dtype=pl.FP32), [R, D], dtype=pl.FP32)
    count = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
    world = pld.world_size()
    signal = pld.window(pld.alloc_window_buffer([world, 2], dtype=pl.INT32), [world, 2], dtype=pl.INT32)
    return inbox, count, signal


def _call(me: int, call: int, windows) -> str:
    """One call, checked against torch; how it ran."""
    rows, live = _data(me, call)
    out = torch.full((R, D), -1.0)
    with run_stats.collect() as stats:
        pass_rows(rows, torch.tensor([call + 1, live], dtype=torch.int32), out, *windows)
    prev_rows, prev_live = _data((me - 1) % pld.world_size(), call)
    want = torch.full((R, D), -1.0)
    want[:prev_live] = prev_rows[:prev_live]
    assert torch.equal(out, want), f"rank {me}, call {call}: received rows differ from torch"
    return stats.replay.kind, stats.replay.reason


def _ring(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        windows = _windows()
        return [_call(rank.rank, call, windows) for call in range(CALLS)]
    finally:
        process.close()


@pytest.mark.timeout(90)
def test_a_communicating_call_replays_with_epoch_and_row_count_changing_every_call():
    results = run_ranks(_ring, 2, deadline_s=60).ok()
    for rank, runs in results.items():
        kinds = [kind for kind, _ in runs]
        assert GUARD_MISS not in kinds, (rank, runs)          # the counts change every call: no guard on them
        assert kinds[-2:] == [REPLAYED, REPLAYED], (rank, runs)
        assert kinds.count(REPLAYED) >= 5, (rank, runs)
        reason = next(reason for kind, reason in runs if kind == REPLAYED)
        assert "communication blocks called as they are" in reason and "guards" not in reason, reason


def _rank_one_stops_early(rank):
    import os

    from pypto_rt.collective import process

    os.environ["PYPTO_TIMEOUT_S"] = "1" if rank.rank == 0 else "20"   # rank 1's exit waits for rank 0's failure
    process.install(rank.comm())
    try:
        windows = _windows()
        with policy_scope(normal_runs=1, trial_replays=0):   # call 1 engine, call 2 recorded, then replays
            for call in range(3):
                _call(rank.rank, call, windows)
            if rank.rank == 0:
                assert replay.decisions(pass_rows)[0].kind == REPLAYED
                _call(0, 3, windows)   # rank 1 never comes: the replayed wait times out
        return "done"
    finally:
        process.close()


@pytest.mark.timeout(60)
def test_a_wait_timing_out_inside_a_replay_gives_the_multi_rank_wait_report():
    outcome = run_ranks(_rank_one_stops_early, 2, deadline_s=40)
    assert outcome.results.get(1) == "done", outcome
    error = outcome.errors[0]
    assert error.get("wait"), error
    wait = error["wait"]
    assert (wait["rank"], wait["label"], list(wait["cell"]), wait["expected"]) == (0, "pass_rows", [1, 0], 4), wait
    assert "pass_rows" in error["text"] and "rank 0" in error["text"], error["text"]
