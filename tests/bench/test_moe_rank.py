"""bench.moe_rank: the number of calls per shape, which every rank must agree on (the calls are collective)."""
from __future__ import annotations

import datetime
import time

import torch.distributed as dist

from bench import moe_rank
from tests.collective.harness import run_ranks


def _plan(ctx):
    dist.init_process_group("gloo", store=dist.PrefixStore("bench/", ctx.store), rank=ctx.rank,
                            world_size=ctx.world_size, timeout=datetime.timedelta(seconds=20))
    slow = 0.1 if ctx.rank == 1 else 0.0       # rank 1's call is the slow one
    plan = moe_rank.plan_calls({"a": lambda: time.sleep(slow)}, iters=50, warmup=10, budget_s=1.0)
    fast = moe_rank.plan_calls({"a": lambda: None}, iters=7, warmup=3, budget_s=1.0)
    dist.destroy_process_group()
    return plan, fast


def test_every_rank_plans_the_same_calls_from_the_slowest_rank():
    (plan0, fast0), (plan1, fast1) = run_ranks(_plan, 2, deadline_s=60).ok().values()
    assert plan0 == plan1 and fast0 == fast1
    warmup, timed = plan0
    assert warmup <= 2 and moe_rank.MIN_ITERS <= timed <= 8   # 0.2 s and 0.8 s of 0.1 s calls
    assert fast0 == (2, 7)                                    # fast calls: as many as asked


def _orders(ctx):
    dist.init_process_group("gloo", store=dist.PrefixStore("bench/", ctx.store), rank=ctx.rank,
                            world_size=ctx.world_size, timeout=datetime.timedelta(seconds=20))
    calls = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in ("base", "ours")}
    samples, spans = moe_rank.time_interleaved(contenders, iters=7, warmup=0, block=3)
    assert all(len(spans[name]) == 7 and all(start <= end for start, end in spans[name]) for name in spans)
    interleaved, calls[:] = list(calls), []
    runs = moe_rank.time_consecutive(contenders, rounds=2, burst=4)
    dist.destroy_process_group()
    return samples, interleaved, runs, calls


def test_contenders_take_turns_in_blocks_and_swap_order_each_round():
    samples, interleaved, runs, consecutive = run_ranks(_orders, 2, deadline_s=60).ok()[0]
    # blocks of 3 calls; the second round starts with the contender that ended the first, so that neither always
    # follows the other
    assert interleaved == ["base"] * 3 + ["ours"] * 3 + ["ours"] * 3 + ["base"] * 3 + ["base"] + ["ours"]
    assert {name: len(s) for name, s in samples.items()} == {"base": 7, "ours": 7}
    assert consecutive == (["base"] * 4 + ["ours"] * 4) * 2
    assert {name: len(r) for name, r in runs.items()} == {"base": 2, "ours": 2}
