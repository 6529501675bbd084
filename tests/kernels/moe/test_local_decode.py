"""MoELayer in a job of one rank at decode size: the whole layer (router, gate, every expert, shared expert, the
weighted sum) is one kernel, reading the token rows directly: no dispatch or combine staging."""
import pytest
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.layers.out_norm import out_proj_add_norm
from pypto_rt.kernels.moe import MoEArgumentError, MoEConfig, MoELayer, load_moe_weights
from pypto_rt.kernels.moe import layer as layer_module
from pypto_rt.kernels.moe.golden import gate_golden, moe_layer_golden
from pypto_rt.language import _runtime
from pypto_rt.language.decorators import KernelFunction
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

H, I, I_SHARED, E, K, T_MAX = 16, 24, 8, 4, 2, 6


def _state_dict(gen, shared: bool, shared_inter: int = I_SHARED) -> dict:
    sd = {"mlp.gate.weight": torch.randn(E, H, generator=gen) * 0.5,
          "mlp.gate.e_score_correction_bias": torch.randn(E, generator=gen) * 0.1}
    experts = [(f"experts.{e}", I) for e in range(E)] + ([("shared_experts", shared_inter)] if shared else [])
    for name, inter in experts:
        for proj, shape in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            sd[f"mlp.{name}.{proj}.weight"] = torch.randn(*shape, generator=gen) / shape[1] ** 0.5
    return sd


def _layer(dtype, shared: bool, score_func: str = "sigmoid", max_tokens: int = T_MAX, shared_inter: int = I_SHARED):
    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=max_tokens, dtype=dtype,
                    score_func=score_func, intermediate_size=I)
    sd = _state_dict(torch.Generator().manual_seed(11), shared, shared_inter)
    return cfg, MoELayer.from_state_dict(cfg, sd, prefix="mlp."), load_moe_weights(cfg, sd, rank=0, world=1,
                                                                                   prefix="mlp.")


def _entries(monkeypatch) -> list[str]:
    """The names of the kernel entries called from plain Python from now on."""
    entries = []
    original = KernelFunction.__call__

    def counted(kernel, *args, **kwargs):
        if _runtime.active() is None:       # an entry called from plain Python, not a kernel a kernel calls
            entries.append(kernel.name)
        return original(kernel, *args, **kwargs)

    monkeypatch.setattr(KernelFunction, "__call__", counted)
    return entries


@pytest.mark.parametrize("executor", ["reference", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shared_inter", [I_SHARED, I, 0], ids=["shared", "shared_of_width_i", "no_shared"])
def test_one_kernel_layer_matches_the_golden_and_counts_routes(executor, dtype, shared_inter):
    """A shared expert as wide as the routed ones joins their swiglu pass (local_decode.swiglu_blocks); another
    width gets its own."""
    cfg, layer, weights = _layer(dtype, shared_inter > 0, shared_inter=shared_inter)
    gen = torch.Generator().manual_seed(3)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    with config.scope(EXECUTOR=executor):
        for tokens in (1, 5, T_MAX):
            x = torch.randn(tokens, H, generator=gen).to(dtype)
            out = layer(x)
            want = moe_layer_golden(cfg, weights, x)
            torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)
            logits = x.float() @ weights.router.weight.float().T
            chosen = (logits.sigmoid() + weights.router.bias).topk(K, dim=-1).indices
            assert torch.equal(layer.recv_counts, torch.bincount(chosen.flatten(), minlength=E).to(torch.int32))


def test_a_decode_call_is_one_kernel_call_and_the_weights_are_stored_once(monkeypatch):
    cfg, layer, _ = _layer(torch.float32, shared=True)
    entries = _entries(monkeypatch)
    layer(torch.randn(3, H))
    assert len(entries) == 1 and "moe_local_decode" in entries[0], entries
    fused = layer._local[0]
    experts, shared = layer.weights.experts, layer.weights.shared
    for w, store in ((experts.w_gate, fused.gate_up), (experts.w_up, fused.gate_up), (shared.w_up, fused.gate_up),
                     (experts.w_down, fused.down), (shared.w_down, fused.down)):
        assert w.untyped_storage().data_ptr() == store.untyped_storage().data_ptr()


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "no_shared"])
def test_one_token_reads_only_its_hit_experts(monkeypatch, shared):
    """One token (K < E): a route kernel, then a kernel on the hit experts' weight slices only; an expert the token
    did not choose is not read (its weights poisoned with NaN leave the output finite and equal to the golden's)."""
    cfg, layer, weights = _layer(torch.float32, shared=shared)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(4))
    want = moe_layer_golden(cfg, weights, x)
    chosen, _ = gate_golden(cfg, x @ weights.router.weight.T, weights.router.bias)
    cold = sorted(set(range(E)) - set(chosen.flatten().tolist()))
    for e in cold:
        for w in (layer.weights.experts.w_gate, layer.weights.experts.w_up, layer.weights.experts.w_down):
            w[e].fill_(float("nan"))
    entries = _entries(monkeypatch)
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
    assert [name.split(".")[-1] for name in entries] == ["moe_local_route", "moe_local_hit"], entries


@pytest.mark.parametrize("executor", ["reference", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 3], ids=["one_token", "batch"])
def test_after_out_proj_is_the_projection_norm_and_layer_in_fewer_calls(monkeypatch, executor, dtype, tokens):
    """after_out_proj gives bit for bit out_proj_add_norm then the layer (output, residual and counted routes); for
    one token the projection, norm and route are one kernel before the hit experts'."""
    cfg, layer, _ = _layer(dtype, shared=True)
    gen = torch.Generator().manual_seed(6)
    attn, w_o = torch.randn(tokens, 12, generator=gen).to(dtype), (torch.randn(H, 12, generator=gen) / 4).to(dtype)
    residual, norm_weight = torch.randn(tokens, H, generator=gen).to(dtype), torch.rand(H, generator=gen).to(dtype)
    with config.scope(EXECUTOR=executor):
        apart_residual = residual.clone()
        want = layer(out_proj_add_norm(attn, w_o, apart_residual, norm_weight, 1e-6))
        want_counts = layer.recv_counts
        entries = _entries(monkeypatch)
        got = layer.after_out_proj(attn, w_o, residual, norm_weight, 1e-6)
    assert torch.equal(got, want) and torch.equal(residual, apart_residual)
    assert torch.equal(layer.recv_counts, want_counts)
    names = [name.split(".")[-1] for name in entries]
    assert names == (["out_proj_norm_route", "moe_local_hit"] if tokens == 1 else
                     ["out_proj_add_norm", "moe_local_decode"]), names


@pytest.mark.parametrize("tokens", [1, 4], ids=["hit_experts", "every_expert"])
def test_calls_with_new_routing_replay(monkeypatch, tokens):
    """Every kernel of the call replays (the hit-experts kernel's expert ids are data it reads, not constants)."""
    kinds: dict[str, list] = {}
    for name in ("local_decode_kernel", "local_route_kernel", "local_hit_kernel"):
        def built(*shape, _name=name, _factory=getattr(layer_module, name)):
            kernel = _factory(*shape)

            def noted(*args):
                with run_stats.collect() as stats:
                    result = kernel(*args)
                kinds.setdefault(_name, []).append(stats.replay.kind)
                return result
            return noted
        monkeypatch.setattr(layer_module, name, built)
    cfg, layer, weights = _layer(torch.float32, shared=True, score_func="softmax")
    gen = torch.Generator().manual_seed(5)
    calls = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 3
    routings = []
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(calls):
            x = torch.randn(tokens, H, generator=gen)
            out = layer(x)
            routings.append(tuple(layer.recv_counts.tolist()))
            torch.testing.assert_close(out, moe_layer_golden(cfg, weights, x), rtol=1e-5, atol=1e-5)
    assert len(set(routings[-3:])) > 1, routings
    assert set(kinds) == ({"local_route_kernel", "local_hit_kernel"} if tokens == 1 else {"local_decode_kernel"})
    for name, seen in kinds.items():
        assert seen[-3:] == [REPLAYED] * 3, (name, seen)


@pytest.mark.parametrize("executor", ["reference", "compiled"])
def test_prefill_sizes_take_the_dispatch_path_over_the_same_weights(executor):
    """Past one gate tile of tokens the layer dispatches as before, its experts reading views of the fused
    layout."""
    tokens = layer_module.LOCAL_MAX_TOKENS + 3
    cfg, layer, weights = _layer(torch.float32, shared=True, max_tokens=tokens)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(8))
    with config.scope(EXECUTOR=executor):
        torch.testing.assert_close(layer(x), moe_layer_golden(cfg, weights, x), rtol=1e-5, atol=1e-5)


def test_a_minus_inf_selection_bias_is_an_error_at_the_layer():
    """The gate's pad slots (the most negative FP32) must never win: a -inf bias is refused where the layer is made."""
    cfg = MoEConfig(hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, intermediate_size=I)
    sd = _state_dict(torch.Generator().manual_seed(11), shared=False)
    sd["mlp.gate.e_score_correction_bias"][1] = -float("inf")
    with pytest.raises(MoEArgumentError, match="MoELayer: the selection bias is -inf at expert 1"):
        MoELayer.from_state_dict(cfg, sd, prefix="mlp.")


def test_a_bad_x_is_an_error_naming_it():
    _, layer, _ = _layer(torch.float32, shared=True)
    with pytest.raises(layer_module.MoEArgumentError, match="hidden"):
        layer(torch.randn(2, H + 1))
