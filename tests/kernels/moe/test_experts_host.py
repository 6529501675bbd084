"""The routed experts on the compiled runtime: the counts bound the row-tile loops inside the kernel, so the host
program reads no device data, and repeated calls replay while the counts change within their row tiles."""
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import MoEConfig
from pypto_rt.kernels.moe.experts import run_experts
from pypto_rt.kernels.moe.golden import experts_golden
from pypto_rt.kernels.moe.weights import ExpertWeights
from pypto_rt.orchestration.host import HostExecutor
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

BF16_TOL = dict(rtol=1.6e-2, atol=1e-2)
CALLS = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2
CFG = MoEConfig(hidden=32, num_experts=4, top_k=2, max_tokens_per_rank=16, intermediate_size=32)


def weights(seed: int) -> ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    return ExpertWeights(*((torch.randn(shape, generator=gen) * 0.2).bfloat16()
                           for shape in ((2, 32, 32), (2, 32, 32), (2, 32, 32))))


def test_the_host_program_reads_no_device_data(monkeypatch):
    host_reads = []
    call_op = HostExecutor.call_op

    def spy(self, name, args, kwargs):
        if name in ("read", "tensor.read", "tile.read", "__getitem__"):
            host_reads.append(name)
        return call_op(self, name, args, kwargs)

    monkeypatch.setattr(HostExecutor, "call_op", spy)
    recv_x = torch.randn(2, 32, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    counts = torch.tensor([5, 32], dtype=torch.int32)
    with config.scope(EXECUTOR="compiled"):
        for form in (weights(2), weights(2).quantize()):
            torch.testing.assert_close(run_experts(CFG, form, recv_x, counts),
                                       experts_golden(CFG, form, recv_x, counts), **BF16_TOL)
    assert host_reads == []


def test_repeated_calls_replay_while_the_counts_change_within_their_tiles():
    gen = torch.Generator().manual_seed(3)
    form = weights(4).quantize()
    seen = set()
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for call in range(CALLS):
            recv_x = torch.randn(2, 32, 32, generator=gen).bfloat16()
            counts = torch.tensor([1 + call % 16, 17 + call % 15], dtype=torch.int32)   # 1 and 2 row tiles
            with run_stats.collect() as stats:
                y = run_experts(CFG, form, recv_x, counts)
            torch.testing.assert_close(y, experts_golden(CFG, form, recv_x, counts), **BF16_TOL)
            seen.add(tuple(counts.tolist()))
    assert len(seen) == CALLS
    assert stats.replay.kind == REPLAYED, stats.replay
