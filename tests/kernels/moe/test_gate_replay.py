"""Repeated gate calls of one shape replay on the compiled executor, also when the routing changes: the kernel
reads no data into the program (no pl.read, no index gather whose bounds are checked on the host)."""
import pytest
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import MoEConfig
from pypto_rt.kernels.moe.gate import gate
from pypto_rt.kernels.moe.golden import gate_golden
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

# engine runs, the recording, the trial's replays and engine runs, then replays only
CALLS = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2


@pytest.mark.parametrize("groups", [{}, dict(n_group=4, topk_group=2)])
def test_repeated_calls_replay_while_the_routing_changes(groups):
    cfg = MoEConfig(hidden=32, num_experts=16, top_k=4, max_tokens_per_rank=8, score_func="sigmoid",
                    routed_scaling_factor=2.0, **groups)
    gen = torch.Generator().manual_seed(9)
    routes = set()
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(CALLS):
            logits, bias = torch.randn(4, 16, generator=gen), torch.randn(16, generator=gen)
            with run_stats.collect() as stats:
                idx, weights = gate(cfg, logits, bias)
            want_idx, want_weights = gate_golden(cfg, logits, bias)
            assert torch.equal(idx, want_idx)
            torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)
            routes.add(tuple(idx.flatten().tolist()))
    assert len(routes) == CALLS
    assert stats.replay.kind == REPLAYED, stats.replay
