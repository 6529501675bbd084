"""Repeated gate calls of one shape replay on the compiled executor, also when the routing changes: the kernel
reads no data into the program (no pl.read; its index gather checks its bounds with an assert a replay runs on
the device side)."""
import re

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


def _replayed_calls(cfg: MoEConfig, gen) -> int:
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(CALLS):
            with run_stats.collect() as stats:
                gate(cfg, torch.randn(4, cfg.num_experts, generator=gen))
    assert stats.replay.kind == REPLAYED, stats.replay
    return int(re.match(r"replay of (\d+) torch calls", stats.replay.reason).group(1))


def test_the_replayed_torch_calls_do_not_grow_with_top_k():
    """The chosen experts' scores are picked by one index-form gather (a compare, select and row sum per slot k
    made 13 torch calls per k)."""
    gen = torch.Generator().manual_seed(4)
    calls = {k: _replayed_calls(MoEConfig(hidden=32, num_experts=8, top_k=k, max_tokens_per_rank=8), gen)
             for k in (1, 4)}
    assert calls[1] == calls[4], calls
