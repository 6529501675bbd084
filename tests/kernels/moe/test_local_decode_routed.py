"""MoELayer's routed capacity form in a job of one rank (kernels/moe/local_decode_routed.py): each expert runs on
its own routes' slot rows; a batch whose routes overflow an expert's slots is run again in the dense form."""
import pytest
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import MoEConfig, MoELayer, load_moe_weights
from pypto_rt.kernels.moe import layer as layer_module
from pypto_rt.kernels.moe import local_decode_routed
from pypto_rt.kernels.moe.golden import moe_layer_golden
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED
from tests.kernels.moe.test_local_decode import _entries

H, I, I_SHARED, E, K, T_MAX = 16, 24, 8, 8, 2, 32
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def routed_from_the_first_batch(monkeypatch):
    """Every batch with T * K >= E takes the routed form (the measured share is for the bench's shapes)."""
    monkeypatch.setattr(local_decode_routed, "ROUTED_MAX_ROW_SHARE", 1.0)


def _layer(dtype, shared: bool, bias: torch.Tensor | None = None):
    gen = torch.Generator().manual_seed(11)
    sd = {"mlp.gate.weight": torch.randn(E, H, generator=gen) * 0.5,
          "mlp.gate.e_score_correction_bias": torch.randn(E, generator=gen) * 0.01 if bias is None else bias}
    experts = [(f"experts.{e}", I) for e in range(E)] + ([("shared_experts", I_SHARED)] if shared else [])
    for name, inter in experts:
        for proj, shape in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            sd[f"mlp.{name}.{proj}.weight"] = torch.randn(*shape, generator=gen) / shape[1] ** 0.5
    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, dtype=dtype, score_func="sigmoid",
                    intermediate_size=I)
    return cfg, MoELayer.from_state_dict(cfg, sd, prefix="mlp."), load_moe_weights(cfg, sd, rank=0, world=1,
                                                                                   prefix="mlp.")


def _kernels(entries) -> list[str]:
    return [name.split(".")[-1] for name in entries]


@pytest.mark.parametrize("executor", ["reference", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "no_shared"])
def test_the_routed_form_matches_the_golden_at_any_batch(monkeypatch, executor, dtype, shared):
    """T = 4 (T * K = E), 7 and 13 (primes) and 32 (the largest one-kernel batch); past T = 4 with fewer slots per
    expert than tokens, so the layout is not the dense one in disguise."""
    cfg, layer, weights = _layer(dtype, shared)
    gen = torch.Generator().manual_seed(3)
    entries = _entries(monkeypatch)
    tol = TOLERANCE[dtype]
    with config.scope(EXECUTOR=executor):
        for tokens in (4, 7, 13, T_MAX):
            x = torch.randn(tokens, H, generator=gen).to(dtype)
            entries.clear()
            out = layer(x)
            slots = local_decode_routed.capacity(layer._local[2], tokens)
            assert (slots < tokens or tokens == 4) and int(layer.recv_counts.max()) <= slots
            assert _kernels(entries) == ["moe_local_routed"], entries
            torch.testing.assert_close(out.float(), moe_layer_golden(cfg, weights, x).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_routes_past_an_experts_slots_are_run_again_in_the_dense_form(monkeypatch, dtype):
    """Every token routed to expert 5 (a selection bias): its T routes overflow its slots, the call is run again
    in the dense form, and the result is still the golden's."""
    bias = torch.zeros(E)
    bias[5] = 10.0
    cfg, layer, weights = _layer(dtype, shared=True, bias=bias)
    x = torch.randn(T_MAX, H, generator=torch.Generator().manual_seed(4)).to(dtype)
    entries = _entries(monkeypatch)
    out = layer(x)
    assert int(layer.recv_counts[5]) == T_MAX
    assert _kernels(entries) == ["moe_local_routed", "moe_local_decode"], entries
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), moe_layer_golden(cfg, weights, x).float(), rtol=tol, atol=tol)


def test_an_expert_with_no_routes_leaves_the_others_exact(monkeypatch):
    """Expert 2 kept out by a large negative bias: it gets no routes, its slots stay empty (zero rows, weight 0),
    and the other experts' results are the golden's."""
    bias = torch.zeros(E)
    bias[2] = -1e30
    cfg, layer, weights = _layer(torch.float32, shared=False, bias=bias)
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(6))
    entries = _entries(monkeypatch)
    out = layer(x)
    assert int(layer.recv_counts[2]) == 0 and _kernels(entries) == ["moe_local_routed"], entries
    torch.testing.assert_close(out, moe_layer_golden(cfg, weights, x), rtol=1e-5, atol=1e-5)


def test_calls_with_new_routing_replay(monkeypatch):
    """The slot layout is tile data computed in the call (no value read into the program), so a call whose routing
    differs from the recorded one replays."""
    kinds = []
    factory = layer_module.local_routed_kernel

    def built(*shape):
        kernel = factory(*shape)

        def noted(*args):
            with run_stats.collect() as stats:
                result = kernel(*args)
            kinds.append(stats.replay.kind)
            return result
        return noted

    monkeypatch.setattr(layer_module, "local_routed_kernel", built)
    cfg, layer, weights = _layer(torch.float32, shared=True)
    gen = torch.Generator().manual_seed(5)
    calls = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 3
    routings = []
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(calls):
            x = torch.randn(11, H, generator=gen)
            out = layer(x)
            routings.append(tuple(layer.recv_counts.tolist()))
            torch.testing.assert_close(out, moe_layer_golden(cfg, weights, x), rtol=1e-5, atol=1e-5)
    assert len(set(routings[-3:])) == 3, routings
    assert kinds[-3:] == [REPLAYED] * 3, kinds


def test_the_routed_form_starts_where_its_slots_are_two_thirds_of_the_tokens(monkeypatch):
    """At E = 8, K = 2 the slots per expert reach 2/3 of T at T = 15 (10 slots): the dense form below, the routed
    form from there; T * K < E never takes it."""
    monkeypatch.undo()
    _, layer, _ = _layer(torch.float32, shared=False)
    shape = layer._local[2]
    assert [t for t in range(1, T_MAX + 1) if local_decode_routed.uses_routed(shape, t)] == list(range(15, T_MAX + 1))


def test_the_capacity_is_past_the_mean_and_never_past_the_batch():
    """Mean routes per expert plus three of their spreads (2 + 3 sqrt 2 -> 7 at T = 8), never past T (T slots
    cannot overflow: a token routes to an expert once)."""
    _, layer, _ = _layer(torch.float32, shared=False)
    shape = layer._local[2]
    assert [local_decode_routed.capacity(shape, t) for t in (1, 4, 8, 32)] == [1, 4, 7, 17]
