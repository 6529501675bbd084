"""The routed experts' decode form replays on the compiled executor while the routing (the counts) changes within
its rows: its course does not follow the counts, so no guard misses."""
import re

import pytest
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import MoEConfig
from pypto_rt.kernels.moe.experts import run_experts
from pypto_rt.kernels.moe.golden import experts_golden
from pypto_rt.kernels.moe.weights import ExpertWeights
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

# engine runs, the recording, the trial's replays and engine runs, then replays only
CALLS = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2
HIDDEN, INTER, TOKENS = 32, 48, 6


@pytest.mark.parametrize("quantized", [False, True])
def test_decode_form_replays_while_the_counts_change(quantized):
    cfg = MoEConfig(hidden=HIDDEN, num_experts=4, top_k=2, max_tokens_per_rank=16, intermediate_size=INTER)
    gen = torch.Generator().manual_seed(3)
    weights = ExpertWeights(*((torch.randn(shape, generator=gen) * 0.2).bfloat16()
                              for shape in ((4, INTER, HIDDEN), (4, INTER, HIDDEN), (4, HIDDEN, INTER))))
    weights = weights.quantize() if quantized else weights
    out = torch.zeros(4, 16, HIDDEN, dtype=torch.bfloat16)
    seen, kinds = set(), []
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(CALLS):
            counts = torch.randint(0, TOKENS + 1, (4,), generator=gen, dtype=torch.int32)
            recv_x = torch.randn(4, 16, HIDDEN, generator=gen).bfloat16()
            with run_stats.collect() as stats:
                y = run_experts(cfg, weights, recv_x, counts, out=out, rows_hint=TOKENS)
            want = experts_golden(cfg, weights, recv_x, counts)
            for e, n in enumerate(counts.tolist()):
                torch.testing.assert_close(y[e, :n], want[e, :n], rtol=1.6e-2, atol=1e-2)
            seen.add(tuple(counts.tolist()))
            kinds.append(stats.replay.kind)
    assert len(seen) > CALLS // 2
    assert kinds[-3:] == [REPLAYED] * 3, kinds


def _replayed_calls(reason: str) -> int:
    match = re.match(r"replay of (\d+) torch calls", reason)
    assert match, reason
    return int(match.group(1))


@pytest.mark.parametrize("quantized", [False, True])
def test_decode_form_replays_as_many_torch_calls_for_2_or_8_local_experts(quantized):
    """The decode form batches its experts' matmuls: its replay's torch calls (Python per call) do not grow with
    the local experts (the per-expert blocks made 35 calls each)."""
    calls = {}
    gen = torch.Generator().manual_seed(5)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for experts in (2, 8):
            cfg = MoEConfig(hidden=HIDDEN, num_experts=experts, top_k=2, max_tokens_per_rank=16,
                            intermediate_size=INTER)
            weights = ExpertWeights(*((torch.randn(shape, generator=gen) * 0.2).bfloat16() for shape in
                                      ((experts, INTER, HIDDEN), (experts, INTER, HIDDEN), (experts, HIDDEN, INTER))))
            weights = weights.quantize() if quantized else weights
            recv_x, out = torch.randn(experts, 16, HIDDEN, generator=gen).bfloat16(), torch.zeros(experts, 16, HIDDEN,
                                                                                                dtype=torch.bfloat16)
            for _ in range(CALLS):
                counts = torch.randint(0, 5, (experts,), generator=gen, dtype=torch.int32)
                with run_stats.collect() as stats:      # 4 rows of top-2 reach every expert: the batched form
                    run_experts(cfg, weights, recv_x, counts, out=out, rows_hint=4)
            assert stats.replay.kind == REPLAYED, stats.replay
            calls[experts] = _replayed_calls(stats.replay.reason)
    assert calls[8] == calls[2], calls


@pytest.mark.parametrize("quantized", [False, True])
def test_hit_experts_form_replays_while_the_routing_changes(quantized):
    """At rows_hint=1 (batch 1) the hit-experts form reads each block's expert id from data: a call routed to other
    experts still replays (no guard pins an id), and only the hit experts run (the others keep out's rows)."""
    cfg = MoEConfig(hidden=HIDDEN, num_experts=8, top_k=2, max_tokens_per_rank=2, intermediate_size=INTER)
    gen = torch.Generator().manual_seed(8)
    weights = ExpertWeights(*((torch.randn(shape, generator=gen) * 0.2).bfloat16()
                              for shape in ((8, INTER, HIDDEN), (8, INTER, HIDDEN), (8, HIDDEN, INTER))))
    weights = weights.quantize() if quantized else weights
    kinds, hits = [], set()
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(CALLS):
            counts = torch.zeros(8, dtype=torch.int32)
            counts[torch.randperm(8, generator=gen)[:2]] = 1
            recv_x = torch.randn(8, 2, HIDDEN, generator=gen).bfloat16()
            out = torch.full_like(recv_x, 7.0)
            with run_stats.collect() as stats:
                y = run_experts(cfg, weights, recv_x, counts, out=out, rows_hint=1)
            want = experts_golden(cfg, weights, recv_x, counts)
            run = [e for e in range(8) if not (y[e] == 7.0).all()]
            assert run == counts.nonzero().view(-1).tolist()
            for e in run:
                torch.testing.assert_close(y[e, :1], want[e, :1], rtol=1.6e-2, atol=1e-2)
            hits.add(tuple(run))
            kinds.append(stats.replay.kind)
    assert len(hits) > CALLS // 2
    assert kinds[-3:] == [REPLAYED] * 3, kinds
