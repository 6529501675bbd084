"""bench.moe_baseline: the Megatron-style gloo dispatch+combine equals the single-process golden at 2 ranks."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from bench.moe_baseline import HOST_READS_PER_CALL, GlooDispatch
from bench.moe_routing import CHECK, EXPERTS_PER_RANK, expert_fn, golden, make_inputs, route_counts
from tests.collective.harness import run_ranks


def _gloo(ctx) -> None:
    dist.init_process_group("gloo", store=dist.PrefixStore("bench/", ctx.store), rank=ctx.rank,
                            world_size=ctx.world_size, timeout=datetime.timedelta(seconds=20))


def _round_trip(base: GlooDispatch, x, idx, w):
    recv = base.dispatch(x, idx, w)
    return recv, base.combine(expert_fn(recv.x, base.global_expert(recv)), recv.handle)


def _every_check_shape(ctx) -> dict:
    _gloo(ctx)
    base, results = GlooDispatch(EXPERTS_PER_RANK), {}
    for shape in CHECK:
        x, idx, w = make_inputs(shape, ctx.world_size, ctx.rank)
        recv, out = _round_trip(base, x, idx, w)
        want = route_counts(shape, ctx.world_size).view(ctx.world_size, -1)[ctx.rank]
        results[str(shape)] = (torch.equal(out, golden(x, idx, w)),
                               torch.equal(torch.bincount(recv.local_expert, minlength=EXPERTS_PER_RANK), want))
    results["host_reads"] = base.host_reads
    dist.destroy_process_group()
    return results


def test_baseline_equals_the_golden_bit_for_bit_at_2_ranks():
    ranks = run_ranks(_every_check_shape, 2, deadline_s=60).ok()
    for rank, results in ranks.items():
        assert results.pop("host_reads") == HOST_READS_PER_CALL * len(CHECK)
        assert results == {str(s): (True, True) for s in CHECK}, (rank, results)


def _uneven(ctx) -> bool:
    """Rank 1 has no tokens; rank 0's go to both ranks' experts."""
    _gloo(ctx)
    x, idx, w = make_inputs(CHECK[0], ctx.world_size, 0)
    if ctx.rank == 1:
        x, idx, w = x[:0], idx[:0], w[:0]
    _, out = _round_trip(GlooDispatch(EXPERTS_PER_RANK), x, idx, w)
    dist.destroy_process_group()
    return out.shape == x.shape and torch.equal(out, golden(x, idx, w))


def test_baseline_with_a_rank_of_zero_tokens():
    assert run_ranks(_uneven, 2, deadline_s=60).ok() == {0: True, 1: True}
