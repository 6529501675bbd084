"""MoEBuffer and MoELayer in a plain process (not launched, world 1): LocalTransport, no windows."""
import pytest
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import MoEBuffer, MoEConfig, MoELayer, load_moe_weights
from pypto_rt.kernels.moe.dispatch_local import LocalTransport
from pypto_rt.kernels.moe.golden import moe_layer_golden
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

H, I, E, K, T_MAX = 16, 24, 4, 2, 6


def _routes(tokens: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(tokens)]) if tokens else \
        torch.zeros(0, K, dtype=torch.int64)
    return idx, torch.rand(tokens, K, generator=gen)


def test_dispatch_and_combine_are_exact_without_a_launch():
    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, dtype=torch.float32)
    buf = MoEBuffer(cfg)
    assert isinstance(buf.transport, LocalTransport)
    gen = torch.Generator().manual_seed(3)
    for tokens in (5, 0, T_MAX):
        x = torch.randn(tokens, H, generator=gen)
        idx, w = _routes(tokens, gen)
        recv = buf.dispatch(x, idx, w)
        want_counts = torch.bincount(idx.flatten(), minlength=E).to(torch.int32)
        assert torch.equal(recv.counts, want_counts)
        for e in range(E):
            tokens_of_e = [t for t in range(tokens) if e in idx[t].tolist()]     # token order
            assert torch.equal(recv.x[e, :len(tokens_of_e)], x[tokens_of_e])
        scale = torch.arange(1, E + 1, dtype=torch.float32).view(E, 1, 1)
        out = buf.combine(recv.x * scale, recv.handle)
        want = (w.unsqueeze(-1) * x.unsqueeze(1) * (idx + 1).unsqueeze(-1).float()).sum(dim=1)
        assert out.shape == (tokens, H)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        assert buf.sent_rows() == [tokens]


def _state_dict(gen) -> dict:
    sd = {"mlp.gate.weight": torch.randn(E, H, generator=gen) * 0.5,
          "mlp.gate.e_score_correction_bias": torch.randn(E, generator=gen) * 0.1}
    for e in list(range(E)):
        for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            sd[f"mlp.experts.{e}.{proj}.weight"] = torch.randn(*shape, generator=gen) / shape[1] ** 0.5
    for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
        sd[f"mlp.shared_experts.{proj}.weight"] = torch.randn(*shape, generator=gen) / shape[1] ** 0.5
    return sd


@pytest.mark.parametrize("dtype, quantize", [(torch.float32, False), (torch.bfloat16, False),
                                             (torch.bfloat16, True)], ids=["fp32", "bf16", "int8"])
def test_moe_layer_matches_its_golden_in_a_plain_process(dtype, quantize):
    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, dtype=dtype,
                    score_func="sigmoid", intermediate_size=I)
    gen = torch.Generator().manual_seed(11)
    sd = _state_dict(gen)
    layer = MoELayer.from_state_dict(cfg, sd, prefix="mlp.", quantize=quantize)
    weights = load_moe_weights(cfg, sd, rank=0, world=1, prefix="mlp.", quantize=quantize)
    tol = 1e-5 if dtype == torch.float32 else 4e-2
    for tokens in (3, 0, T_MAX):
        x = torch.randn(tokens, H, generator=gen).to(dtype)
        out = layer(x)
        want = moe_layer_golden(cfg, weights, x)
        assert out.shape == want.shape and out.dtype == dtype
        torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)


def test_repeated_calls_replay_as_torch_calls_while_the_routing_changes():
    """No region reads a count: every call after the trial replays its recorded torch calls, none called as is."""
    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, dtype=torch.float32)
    buf = MoEBuffer(cfg)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, H, generator=gen)
    calls = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(calls):
            idx, w = _routes(4, gen)
            with run_stats.collect() as dispatched:
                recv = buf.dispatch(x, idx, w)
            with run_stats.collect() as combined:
                out = buf.combine(recv.x, recv.handle)
            torch.testing.assert_close(out, (w.unsqueeze(-1) * x.unsqueeze(1)).sum(dim=1), rtol=1e-5, atol=1e-5)
    for stats in (dispatched, combined):
        assert stats.replay.kind == REPLAYED and "as they are" not in stats.replay.reason, stats.replay


def test_argument_checks_run_once_per_signature_and_the_expert_ids_on_every_call(monkeypatch):
    """A decode loop repeats a few argument signatures: their types, shapes and dtypes are checked once each; the
    expert ids are data and are checked on every call (a bad id after good calls of that shape still raises),
    unless check_routes=False."""
    from pypto_rt.kernels.moe.moe_errors import MoEArgumentError

    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, dtype=torch.float32)
    buf = MoEBuffer(cfg)
    checks, real = [], buf._check_arguments
    monkeypatch.setattr(buf, "_check_arguments", lambda *a: checks.append(a[0].shape[0]) or real(*a))
    gen = torch.Generator().manual_seed(5)
    for tokens in (3, 3, 2, 3, 2):
        idx, w = _routes(tokens, gen)
        recv = buf.dispatch(torch.randn(tokens, H, generator=gen), idx, w)
        buf.combine(recv.x, recv.handle)
    assert checks == [3, 2]
    idx, w = _routes(3, gen)
    for bad, match in ((E, r"topk_idx\[1, 0\] = 4 is not an expert id"), (-1, r"topk_idx\[1, 0\] = -1"),
                       ("repeat", "token 1 routes to expert")):
        wrong = idx.clone()
        wrong[1, 0] = wrong[1, 1] if bad == "repeat" else bad
        with pytest.raises(MoEArgumentError, match=match):
            buf.dispatch(torch.randn(3, H), wrong, w)
    with pytest.raises(MoEArgumentError, match="x is torch.float64"):
        buf.dispatch(torch.randn(3, H, dtype=torch.float64), idx, w)
    assert checks == [3, 2, 3]
    unchecked = MoEBuffer(cfg, check_routes=False)
    monkeypatch.setattr(unchecked, "_route_error", lambda *a: pytest.fail("routes checked"))
    monkeypatch.setattr(torch, "aminmax", lambda *a: pytest.fail("routes checked"))
    recv = unchecked.dispatch(torch.randn(3, H), idx, w)
    unchecked.combine(recv.x, recv.handle)
