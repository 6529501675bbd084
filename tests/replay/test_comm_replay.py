"""Replay of entry calls that communicate: a communication task's block replays as recorded calls, its `pld` ops
as calls of their effects (replay.comm_block), or, where that cannot be recorded, as one opaque call of its kernel.

What users depend on (a serving engine calling a dispatch kernel every decode step with the same shapes): such a
call replays, with the epoch and the row count it reads from data changing every call, its results right every
call, whichever way each rank runs it; numbers read from a window are never taken as unchanged since the call
started; offsets and numbers going into or out of a communication block stay code (no guard); a wait that times
out inside a replay ends with the usual multi-rank wait report. One or two ranks, forked
(tests.collective.harness).
"""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt import run_stats
from pypto_rt.replay import entry as replay
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import DISABLED, ENGINE, RECORDED, REPLAYED
from tests.collective.harness import run_ranks

R, D = 8, 16
NR = pl.dynamic("NR")
CALLS = 12
POLICY = ReplayPolicy()
REPLAYS = CALLS - POLICY.normal_runs - 1   # every call after the recorded one


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
        # no guard on the counts (they change every call), no timed trial (peer waits would make it noise); the
        # block's loop over a count read from a window cannot be recorded op by op (replay.comm_block): the first
        # recording is refused inside it, the next one calls it as it is
        assert kinds == [ENGINE] * (POLICY.normal_runs + 1) + [RECORDED] + [REPLAYED] * (REPLAYS - 1), (rank, runs)
        assert "refused inside a block" in runs[POLICY.normal_runs][1], runs[POLICY.normal_runs]
        reason = next(reason for kind, reason in runs if kind == REPLAYED)
        assert "1 kernel blocks called as they are" in reason and "guards" not in reason, reason


def _ring_rank_one_on_engine(rank):
    from pypto_rt import config
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        windows = _windows()
        with config.scope(REPLAY="1" if rank.rank == 0 else "0"):
            return [_call(rank.rank, call, windows)[0] for call in range(CALLS)]
    finally:
        process.close()


@pytest.mark.timeout(90)
def test_ranks_decide_alone_one_replaying_while_the_other_runs_the_engine():
    results = run_ranks(_ring_rank_one_on_engine, 2, deadline_s=60).ok()
    assert results[0] == [ENGINE] * (POLICY.normal_runs + 1) + [RECORDED] + [REPLAYED] * (REPLAYS - 1), results[0]
    assert set(results[1]) == {DISABLED}, results[1]   # (PYPTO_REPLAY=0 on rank 1)


def _rank_one_stops_early(rank):
    import os

    from pypto_rt.collective import process

    os.environ["PYPTO_TIMEOUT_S"] = "1" if rank.rank == 0 else "20"   # rank 1's exit waits for rank 0's failure
    process.install(rank.comm())
    try:
        windows = _windows()
        with policy_scope(normal_runs=1):   # call 1 on the engine, call 2 recorded, then replays
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
    assert wait["peers"] == [1], wait   # the peer that would set the cell, and the deadline, in the report:
    assert "rank 0 waits in `wait` (label pass_rows) for cell [1, 0]" in error["text"], error["text"]
    assert "which rank 1 would set for 1.0 s" in error["text"], error["text"]


@pl.jit
def send_count(
    meta: pl.Tensor[[1, 2], pl.INT32],           # [[epoch, count]]
    count: pld.DistributedTensor[[1, 1], pl.INT32],
    signal: pld.DistributedTensor[[2, 1], pl.INT32],
):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="send_count"):
        epoch = pl.read(meta, [0, 0])
        pld.tile.remote_store(pl.load(meta, [0, 1], [1, 1]), target=count, peer=1, offsets=[0, 0])
        pld.system.notify(signal, peer=1, offsets=[0, 0], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[1, 0], expected=epoch, cmp=pld.WaitCmp.Ge)   # taken
    return signal


@pl.jit
def take_count(
    src: pl.Tensor[[R, D], pl.FP32],
    meta: pl.Tensor[[1], pl.INT32],              # [epoch]
    out: pl.Out[pl.Tensor[[R, D], pl.FP32]],
    count: pld.DistributedTensor[[1, 1], pl.INT32],
    signal: pld.DistributedTensor[[2, 1], pl.INT32],
):
    epoch = pl.read(meta, [0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="wait_count"):   # takes the signal window only
        pld.system.wait(signal=signal, offsets=[0, 0], expected=epoch, cmp=pld.WaitCmp.Ge)
    live = pl.read(count, [0, 0])   # on the host: the window rank 0 wrote during this call
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_live"):
        for i in pl.range(live):
            out = pl.store(pl.load(src, [i, 0], [1, D]), [i, 0], out)
        pld.system.notify(signal, peer=0, offsets=[1, 0], value=epoch, op=pld.NotifyOp.Set)
    return out


def _counts(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        count = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
        signal = pld.window(pld.alloc_window_buffer([2, 1], dtype=pl.INT32), [2, 1], dtype=pl.INT32)
        src = torch.randn(R, D)
        kinds = []
        for call in range(CALLS):
            live = (5 * call + 2) % (R + 1)
            with run_stats.collect() as stats:
                if rank.rank == 0:
                    send_count(torch.tensor([[call + 1, live]], dtype=torch.int32), count, signal)
                else:
                    out = torch.zeros(R, D)
                    take_count(src, torch.tensor([call + 1], dtype=torch.int32), out, count, signal)
                    want = torch.zeros(R, D)
                    want[:live] = src[:live]
                    assert torch.equal(out, want), f"call {call}: copied rows differ from the {live} sent"
            kinds.append(stats.replay.kind)
        return kinds
    finally:
        process.close()


@pytest.mark.timeout(90)
def test_a_number_read_from_a_window_on_the_host_is_read_where_the_run_read_it():
    # rank 1's own regions never write `count` (rank 0 does): read in the replay's prologue, before the wait,
    # it would be the previous call's count (copy_live's loop over it refuses the first recording inside the block:
    # the next one calls the block as it is)
    kinds = run_ranks(_counts, 2, deadline_s=60).ok()[1]
    assert kinds == [ENGINE] * (POLICY.normal_runs + 1) + [RECORDED] + [REPLAYED] * (REPLAYS - 1), kinds


def _outside_window_view(rank):
    from pypto_rt.collective import process
    from pypto_rt.replay.capture import Recorder

    process.install(rank.comm())
    try:
        buf = pld.alloc_window_buffer([4, 4], dtype=pl.FP32)
        entry, outside = pld.window(buf, [4, 4], dtype=pl.FP32), pld.window(buf, [4, 4], dtype=pl.FP32)
        plain = torch.zeros(4, 4)
        with Recorder([entry, plain]) as rec:
            torch.add(outside, 1.0)   # a window view made before the run, sharing the entry window's memory
        with Recorder([plain[1:]]) as other:
            torch.add(plain, 1.0)     # an ordinary outside tensor sharing an entry tensor's memory
        return rec.refused, sorted(rec.volatile), other.refused, _adds_kept(entry), _adds_kept(plain)
    finally:
        process.close()


def _adds_kept(t: torch.Tensor) -> int:
    """How many of two equal calls on `t`, with nothing written in between, the replay keeps."""
    from pypto_rt.replay.capture import Recorder

    with Recorder([t]) as rec:
        first, second = torch.add(t, 1.0), torch.add(t, 1.0)
    return rec.source([rec.name_of(first), rec.name_of(second)]).count("add_")


@pytest.mark.timeout(60)
def test_window_memory_is_volatile_and_may_be_shared_with_an_outside_window_view():
    window, volatile, ordinary, window_adds, plain_adds = run_ranks(_outside_window_view, 1, deadline_s=30).ok()[0]
    assert window is None and len(volatile) == 1, window   # (and its memory is volatile)
    assert ordinary is not None and "shares memory with an entry tensor" in ordinary, ordinary
    # peers may write a window between two equal reads of it: the replay keeps both (an ordinary tensor: one)
    assert (window_adds, plain_adds) == (2, 1), (window_adds, plain_adds)


@pl.jit
def row_at(rows: pl.Tensor[[R, D], pl.FP32], meta: pl.Tensor[[1], pl.INT32],
           out: pl.Out[pl.Tensor[[1, D], pl.FP32]], flag: pld.DistributedTensor[[1, 1], pl.INT32]):
    off = pl.read(meta, [0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="row_at"):
        pld.system.notify(flag, peer=0, offsets=[0, 0], value=1, op=pld.NotifyOp.AtomicAdd)
        out = pl.store(pl.load(rows, [off, 0], [1, D]), [0, 0], out)   # a box at an offset read from data
    return out


def _rows_at(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        flag = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
        rows, kinds = torch.randn(R, D), []
        for call in range(CALLS):
            out = torch.zeros(1, D)
            with run_stats.collect() as stats:
                # (rows below the last: the last row's box takes another course in the op library, a guard)
                row_at(rows, torch.tensor([call % (R - 1)], dtype=torch.int32), out, flag)
            assert torch.equal(out, rows[call % (R - 1) : call % (R - 1) + 1]), f"call {call}"
            kinds.append(stats.replay.kind)
        return kinds
    finally:
        process.close()


@pytest.mark.timeout(60)
def test_an_offset_read_from_data_in_a_communication_blocks_inputs_is_not_guarded():
    # the host works out the task's tensor boxes from its inputs (to order it on the engine): in a recorded run
    # that must not pin the offset (a guard on it would miss on every call with another row)
    kinds = run_ranks(_rows_at, 1, deadline_s=40).ok()[0]
    assert kinds == [ENGINE] * POLICY.normal_runs + [RECORDED] + [REPLAYED] * REPLAYS, kinds


@pl.jit
def scaled_by_count(rows: pl.Tensor[[R, D], pl.FP32], meta: pl.Tensor[[1], pl.INT32],
                    out: pl.Out[pl.Tensor[[R, D], pl.FP32]], flag: pld.DistributedTensor[[1, 1], pl.INT32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="count"):
        pld.system.notify(flag, peer=0, offsets=[0, 0], value=1, op=pld.NotifyOp.AtomicAdd)
        m = pl.read(meta, [0]) + 1   # a number the communication block returns to the host
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        out = pl.store(pl.mul(pl.load(rows, [0, 0], [R, D]), m), [0, 0], out)
    return out


def _scaled(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        flag = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
        rows, kinds = torch.randn(R, D), []
        for call in range(CALLS):
            out = torch.zeros(R, D)
            with run_stats.collect() as stats:
                scaled_by_count(rows, torch.tensor([call], dtype=torch.int32), out, flag)
            assert torch.equal(out, rows * (call + 1)), f"call {call}"
            kinds.append(stats.replay.kind)
        return kinds
    finally:
        process.close()


@pytest.mark.timeout(60)
def test_a_number_a_communication_block_returns_is_code_of_the_replay():
    kinds = run_ranks(_scaled, 1, deadline_s=40).ok()[0]
    assert kinds == [ENGINE] * POLICY.normal_runs + [RECORDED] + [REPLAYED] * REPLAYS, kinds


@pl.jit
def ring_sum(
    rows: pl.Tensor[[R, D], pl.FP32],
    meta: pl.Tensor[[1], pl.INT32],              # [epoch]
    out: pl.Out[pl.Tensor[[R, D], pl.FP32]],
    inbox: pld.DistributedTensor[[R, D], pl.FP32],
    signal: pld.DistributedTensor[[NR, 2], pl.INT32],
):
    signal.bind_dynamic(0, NR)
    epoch = pl.read(meta, [0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_send"):
        ctx = pld.get_comm_ctx(inbox)
        me = pld.rank(ctx)
        world = pld.nranks(ctx)
        nxt = (me + 1) % world
        prv = (me + world - 1) % world
        pld.tensor.put(dst=inbox, peer=nxt, src=rows, dst_offsets=[0, 0], src_offsets=[0, 0], shape=[R, D])
        pld.system.notify(signal, peer=nxt, offsets=[me, 0], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[prv, 0], expected=epoch, cmp=pld.WaitCmp.Ge)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_take"):   # takes a window, calls no pld op
        out[:, :] = pl.add(pl.load(inbox, [0, 0], [R, D]), pl.load(rows, [0, 0], [R, D]))
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_done"):   # the inbox may be written again
        pld.system.notify(signal, peer=prv, offsets=[me, 1], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[nxt, 1], expected=epoch, cmp=pld.WaitCmp.Ge)
    return out


def _ring_sums(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        inbox = pld.window(pld.alloc_window_buffer([R, D], dtype=pl.FP32), [R, D], dtype=pl.FP32)
        world = pld.world_size()
        signal = pld.window(pld.alloc_window_buffer([world, 2], dtype=pl.INT32), [world, 2], dtype=pl.INT32)
        runs = []
        for call in range(CALLS):
            rows, _ = _data(rank.rank, call)
            out = torch.zeros(R, D)
            with run_stats.collect() as stats:
                ring_sum(rows, torch.tensor([call + 1], dtype=torch.int32), out, inbox, signal)
            prev_rows, _ = _data((rank.rank - 1) % world, call)
            assert torch.equal(out, prev_rows + rows), f"rank {rank.rank}, call {call}: the sum differs from torch"
            runs.append((stats.replay.kind, stats.replay.reason))
        return runs
    finally:
        process.close()


@pytest.mark.timeout(90)
def test_a_block_that_only_takes_windows_replays_as_torch_calls_reading_the_peers_latest_rows():
    results = run_ranks(_ring_sums, 2, deadline_s=60).ok()
    for rank, runs in results.items():
        assert [kind for kind, _ in runs] == [ENGINE] * POLICY.normal_runs + [RECORDED] + [REPLAYED] * REPLAYS, runs
        reason = next(reason for kind, reason in runs if kind == REPLAYED)
        # the two signalling blocks' put, notify and wait are recorded calls (replay.comm_block), ring_take's add a
        # recorded torch call: no block is called as it is
        assert "called as they are" not in reason, reason


@pl.jit
def ring_live(
    rows: pl.Tensor[[R, D], pl.FP32],
    meta: pl.Tensor[[2], pl.INT32],              # [epoch, live rows this rank sends]
    out: pl.Out[pl.Tensor[[R, D], pl.FP32]],
    inbox: pld.DistributedTensor[[R, D], pl.FP32],
    count: pld.DistributedTensor[[1, 1], pl.INT32],
    signal: pld.DistributedTensor[[NR, 2], pl.INT32],
):
    signal.bind_dynamic(0, NR)
    epoch = pl.read(meta, [0])
    n = pl.read(meta, [1])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="live_send"):
        ctx = pld.get_comm_ctx(inbox)
        me = pld.rank(ctx)
        world = pld.nranks(ctx)
        nxt = (me + 1) % world
        prv = (me + world - 1) % world
        pld.tensor.put(dst=inbox, peer=nxt, src=rows, dst_offsets=[0, 0], src_offsets=[0, 0], shape=[R, D])
        pld.tile.remote_store(pl.full([1, 1], dtype=pl.INT32, value=n), target=count, peer=nxt, offsets=[0, 0])
        pld.system.notify(signal, peer=nxt, offsets=[me, 0], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[prv, 0], expected=epoch, cmp=pld.WaitCmp.Ge)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="live_take"):   # its course follows a number in a window
        for i in pl.range(pl.read(count, [0, 0])):
            out = pl.store(pl.load(inbox, [i, 0], [1, D]), [i, 0], out)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="live_done"):
        pld.system.notify(signal, peer=prv, offsets=[me, 1], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[nxt, 1], expected=epoch, cmp=pld.WaitCmp.Ge)
    return out


def _ring_lives(rank):
    from pypto_rt.collective import process

    process.install(rank.comm())
    try:
        inbox, count, signal = _windows()
        runs = []
        for call in range(CALLS):
            rows, live = _data(rank.rank, call)
            out = torch.full((R, D), -1.0)
            with run_stats.collect() as stats:
                ring_live(rows, torch.tensor([call + 1, live], dtype=torch.int32), out, inbox, count, signal)
            prev_rows, prev_live = _data((rank.rank - 1) % pld.world_size(), call)
            want = torch.full((R, D), -1.0)
            want[:prev_live] = prev_rows[:prev_live]
            assert torch.equal(out, want), f"rank {rank.rank}, call {call}: received rows differ from torch"
            runs.append((stats.replay.kind, stats.replay.reason))
        return runs
    finally:
        process.close()


@pytest.mark.timeout(90)
def test_a_window_block_whose_course_follows_a_window_is_recorded_again_as_called_as_it_is():
    results = run_ranks(_ring_lives, 2, deadline_s=60).ok()
    for rank, runs in results.items():
        kinds = [kind for kind, _ in runs]
        assert REPLAYED in kinds and kinds[-1] == REPLAYED, runs
        reason = runs[-1][1]
        # live_take only: its loop bound is read from a window (live_send and live_done are recorded calls)
        assert "1 kernel blocks called as they are" in reason, reason
