"""bench.moe_routing: the MoE benchmark's inputs, golden and byte accounting (one process)."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from bench.moe_routing import CHECK, EXPERTS_PER_RANK, MoEShape, accounting, expert_fn, golden, live_rows, \
    make_inputs, route_counts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIFORM, SKEWED = MoEShape("decode", 6, 16, 3, False), MoEShape("decode", 6, 16, 3, True)


def test_inputs_are_the_same_in_every_process():
    # a rank rebuilds its peers' routing to know what it must receive: the seed may not depend on str hashing
    code = ("from bench.moe_routing import CHECK, make_inputs; import torch; "
            "print([float(sum(t.double().sum() for t in make_inputs(s, 2, 1))) for s in CHECK])")
    outs = {subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    here = str([float(sum(t.double().sum() for t in make_inputs(s, 2, 1))) for s in CHECK]) + "\n"
    assert outs == {here}


def test_routing_picks_distinct_experts_and_skewed_goes_to_rank_0():
    for world in (2, 4):
        for rank in range(world):
            _, idx, w = make_inputs(UNIFORM, world, rank)
            assert idx.shape == (6, 3) and int(idx.max()) < UNIFORM.num_experts(world)
            assert all(len(set(row)) == 3 for row in idx.tolist())
            torch.testing.assert_close(w.sum(dim=1), torch.ones(6))
            assert int(make_inputs(SKEWED, world, rank)[1].max()) < EXPERTS_PER_RANK


def test_golden_is_the_weighted_sum_of_expert_outputs():
    x, idx, w = make_inputs(UNIFORM, 2, 0)
    naive = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            naive[t] += float(w[t, j]) * x[t].double() * (int(idx[t, j]) + 1)
    torch.testing.assert_close(golden(x, idx, w).double(), naive, rtol=2e-2, atol=2e-2)
    assert torch.equal(expert_fn(x[:2], torch.tensor([0, 3])), torch.stack([x[0], x[1] * 4]))


def test_live_rows_count_unique_token_destination_pairs():
    e = EXPERTS_PER_RANK
    assert live_rows(torch.tensor([[0, 1, e + 1], [e, e + 1, 2 * e]])) == 2 + 2
    assert live_rows(torch.tensor([[0, 1, 2]])) == 1
    assert live_rows(torch.empty(0, 3, dtype=torch.long)) == 0


def test_accounting_adds_up_over_ranks():
    for shape in CHECK:
        world = 2
        rows = [accounting(shape, world, r) for r in range(world)]
        pairs_bytes = shape.tokens * shape.top_k * shape.row_bytes()
        assert all(r["logical"] == 2 * pairs_bytes for r in rows)
        assert all(r["baseline_wire"] == 2 * pairs_bytes + 8 * shape.num_experts(world) for r in rows)
        assert sum(r["baseline_recv"] for r in rows) == world * pairs_bytes   # every selected row lands once
        assert all(r["live"] <= r["logical"] for r in rows)
        assert int(route_counts(shape, world).sum()) == world * shape.tokens * shape.top_k
    skewed = [accounting(SKEWED, 2, r) for r in range(2)]
    assert skewed[1]["baseline_recv"] == 0 and all(r["live"] * 3 == r["logical"] for r in skewed)
