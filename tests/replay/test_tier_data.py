"""The compiled tier on kernels whose torch calls take offsets and operands from values read from data (pl.read):
those values are carried from the Python prologue into the graph as symbolic integers, so one compiled graph
serves later calls with other slots, lengths, tables or routing, each compared to the reference.

Each kernel is compiled once (eager tier, no trial end), then every call is made to run the compiled function.
Compiles take seconds here (tens on a loaded machine).
"""
from __future__ import annotations

import os

import pytest
import torch

from pypto_rt import config
from pypto_rt.golden.files import load_kernel_file
from pypto_rt.kernels.attention import cache_write, golden, paged, paged_decode_attention, write_kv_cache
from pypto_rt.kernels.moe import MoEConfig
from pypto_rt.kernels.moe.experts import run_experts
from pypto_rt.kernels.moe.golden import experts_golden
from pypto_rt.kernels.moe.weights import ExpertWeights
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.replay.tier import TRIAL, Tier

# keep the replay (no engine trial); compile at the first replay; keep trying both tiers (the trial never ends)
KEEP = dict(slower=float("inf"), parallel=float("inf"), trial_replays=0, tier_trial_calls=1 << 30,
            tier_after_replays=0)
WARM = ReplayPolicy().normal_runs + 3   # engine runs, the recording, the first replay (which compiles)
CHANGED = 12                            # calls with other data, all compiled
HERE = os.path.dirname(os.path.abspath(__file__))


def compiled_tiers(named: str) -> list[Tier]:
    """The tiers of entries whose name contains `named`, made to run their compiled function on every call."""
    import gc
    found = [t for t in gc.get_objects() if type(t) is Tier and named in t.entry and t.tiered is not None]
    for t in found:
        assert t.state == TRIAL, t.text
        t.chosen = t.tiered
    return found


def test_paged_kv_append_compiled_with_changing_slots():
    c06 = load_kernel_file(os.path.join(HERE, "..", "conformance", "c06_paged_kv_append.py"), "c06_tier_data")
    gen = torch.Generator().manual_seed(6)

    def call():
        slots = torch.randperm(c06.NUM_BLOCKS * c06.BLOCK_SIZE, generator=gen)[:c06.N_NEW].to(torch.int32)
        slots[::4] = -1   # (the same rows are padding each call: other ones take another course, a guard)
        new = torch.randn(c06.N_NEW, c06.HEAD_DIM, generator=gen).bfloat16()
        cache = torch.randn(c06.NUM_BLOCKS, c06.BLOCK_SIZE, c06.HEAD_DIM, generator=gen).bfloat16()
        want = cache.clone()
        c06.golden_kv_append(dict(kv_cache=want, slot_mapping=slots, new_kv=new))
        c06.kv_append(new, slots, cache)
        assert torch.equal(cache, want), f"slots {slots.tolist()}"

    with config.scope(TIER="eager", EXECUTOR="compiled"), policy_scope(**KEEP):
        for _ in range(WARM):
            call()
        (tier,) = compiled_tiers("kv_append")
        for _ in range(CHANGED):
            call()
    assert tier.tiered.outside < CHANGED, "the compiled graph was hardly used"


def test_paged_decode_and_cache_write_compiled_with_changing_lengths_and_tables():
    for builder in (cache_write.cache_write_kernel, paged.decode_kernel):
        builder.cache_clear()
    b, nb, bs, mb, kvh, qh, d = 3, 24, 4, 6, 2, 4, 8
    gen = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(nb, bs, kvh, d, generator=gen), torch.randn(nb, bs, kvh, d, generator=gen)

    def step(n):
        tables = torch.randperm(nb, generator=gen)[: b * mb].int().view(b, mb)
        lens = torch.tensor([1 + n, 0, mb * bs - n], dtype=torch.int32)   # (their order kept: the guards')
        slots = torch.tensor([int(tables[i, (k - 1) // bs]) * bs + (k - 1) % bs if k else -1
                              for i, k in enumerate(lens.tolist())])
        key, value, q = (torch.randn(b, h, d, generator=gen) for h in (kvh, kvh, qh))
        want_k, want_v = kc.clone(), vc.clone()
        golden.write_kv_cache(key, value, want_k, want_v, slots)
        write_kv_cache(key, value, kc, vc, slots)
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v), f"step {n}"
        out = paged_decode_attention(q, kc, vc, tables, lens)
        torch.testing.assert_close(out, golden.paged_decode_attention(q, kc, vc, tables, lens))

    with config.scope(TIER="eager", EXECUTOR="compiled"), policy_scope(**KEEP):
        for n in range(WARM):
            step(n)
        assert len(compiled_tiers("kv_cache_write")) == 1 and len(compiled_tiers("paged_decode_attention")) == 1
        for n in range(WARM, WARM + CHANGED):
            step(n)


def test_hit_experts_compiled_with_changing_routing():
    hidden, inter = 32, 48
    cfg = MoEConfig(hidden=hidden, num_experts=8, top_k=2, max_tokens_per_rank=2, intermediate_size=inter)
    gen = torch.Generator().manual_seed(8)
    weights = ExpertWeights(*((torch.randn(shape, generator=gen) * 0.2).bfloat16()
                              for shape in ((8, inter, hidden), (8, inter, hidden), (8, hidden, inter))))
    routes = set()

    def call():
        counts = torch.zeros(8, dtype=torch.int32)
        counts[torch.randperm(8, generator=gen)[:2]] = 1   # the hit experts' ids are read from data
        recv_x = torch.randn(8, 2, hidden, generator=gen).bfloat16()
        out = torch.full_like(recv_x, 7.0)
        y = run_experts(cfg, weights, recv_x, counts, out=out, rows_hint=1)
        want = experts_golden(cfg, weights, recv_x, counts)
        hit = counts.nonzero().view(-1).tolist()
        assert [e for e in range(8) if not (y[e] == 7.0).all()] == hit, "other experts' rows were written"
        for e in hit:
            torch.testing.assert_close(y[e, :1], want[e, :1], rtol=1.6e-2, atol=1e-2)
        routes.add(tuple(hit))

    with config.scope(TIER="eager", EXECUTOR="compiled"), policy_scope(**KEEP):
        for _ in range(WARM):
            call()
        (tier,) = compiled_tiers("moe_experts_slots")
        routes.clear()
        for _ in range(CHANGED):
            call()
    assert len(routes) > CHANGED // 2
    assert tier.tiered.outside < CHANGED, "the compiled graph was hardly used"


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
