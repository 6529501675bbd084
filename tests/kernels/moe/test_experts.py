"""The routed experts, the shared expert and the router GEMM against their torch goldens, on both executors."""
import pytest
import torch

from pypto_rt import config
from pypto_rt.kernels.moe import MoEArgumentError, MoEConfig
from pypto_rt.kernels.moe import experts as experts_module
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe import router as router_module
from pypto_rt.kernels.moe.experts import run_experts, shared_expert
from pypto_rt.kernels.moe.golden import experts_golden, router_golden, shared_expert_golden
from pypto_rt.kernels.moe.router import router_logits
from pypto_rt.kernels.moe.weights import ExpertWeights

BF16_TOL = dict(rtol=1.6e-2, atol=1e-2)       # a bf16 ulp or two: the kernel's FP32 sums may differ in order
INT8_TOL = dict(rtol=8e-3, atol=1e-3)         # one bf16 ulp of the output: the int8 products are exact
HIDDEN, INTER, WORLD, T_MAX = 32, 48, 2, 12    # 8 experts over 2 ranks: 4 local experts of R = 24 rows


@pytest.fixture(params=["reference", "compiled"], autouse=True)
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


def make(**changes) -> MoEConfig:
    return MoEConfig(**{**dict(hidden=HIDDEN, num_experts=8, top_k=2, max_tokens_per_rank=T_MAX,
                               intermediate_size=INTER), **changes})


def expert_weights(n: int, seed: int, inter: int = INTER, scale: float = 0.2) -> ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    shapes = ((n, inter, HIDDEN), (n, inter, HIDDEN), (n, HIDDEN, inter))
    return ExpertWeights(*((torch.randn(shape, generator=gen) * scale).bfloat16() for shape in shapes))


def dispatched(seed: int, counts: list[int]):
    """recv_x [4, 24, H] with stale (non-finite and huge) rows past each count, and counts as int32."""
    x = torch.randn(len(counts), WORLD * T_MAX, HIDDEN, generator=torch.Generator().manual_seed(seed)).bfloat16()
    for e, n in enumerate(counts):
        x[e, n:] = float("nan") if e % 2 else 1e30
    return x, torch.tensor(counts, dtype=torch.int32)


def forms(weights: ExpertWeights) -> dict:
    return {"bf16": weights, "int8": weights.quantize()}


@pytest.mark.parametrize("form", ["bf16", "int8"])
@pytest.mark.parametrize("counts", [[0, 5, 16, 24], [24, 24, 24, 24], [0, 0, 0, 0], [1, 17, 0, 3]])
def test_routed_experts_match_the_golden(form, counts):
    cfg, weights = make(), forms(expert_weights(4, 1))[form]
    recv_x, live = dispatched(2, counts)
    y = run_experts(cfg, weights, recv_x, live)
    assert y.dtype == torch.bfloat16 and y.shape == recv_x.shape
    torch.testing.assert_close(y, experts_golden(cfg, weights, recv_x, live), **(INT8_TOL if form == "int8" else
                                                                                   BF16_TOL))


@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_rows_past_counts_are_zeros_in_their_tile_and_untouched_after_it(form):
    cfg, weights = make(), forms(expert_weights(4, 3))[form]
    recv_x, live = dispatched(4, [3, 0, 20, 24])       # stale rows: NaN and 1e30
    out = torch.full_like(recv_x, 7.0)
    y = run_experts(cfg, weights, recv_x, live, out=out)
    assert y is out
    want = experts_golden(cfg, weights, recv_x, live)
    for e, n in enumerate(live.tolist()):
        tile_end = min(-(-n // 16) * 16, WORLD * T_MAX)
        torch.testing.assert_close(y[e, :n], want[e, :n], **BF16_TOL)
        assert (y[e, n:tile_end] == 0).all() and (y[e, tile_end:] == 7.0).all()


@pytest.mark.parametrize("form", ["bf16", "int8"])
@pytest.mark.parametrize("counts", [[0, 5, 6, 3], [1, 7, 0, 24]])     # within the hint's 6 rows, and past them
def test_decode_form_matches_the_golden_within_and_past_its_rows(form, counts):
    cfg, weights = make(), forms(expert_weights(4, 5))[form]
    recv_x, live = dispatched(6, counts)
    out = torch.full_like(recv_x, 7.0)
    y = run_experts(cfg, weights, recv_x, live, out=out, rows_hint=6)
    assert y is out and experts_module.decode_rows(6, WORLD * T_MAX) == 6
    want = experts_golden(cfg, weights, recv_x, live)
    for e, n in enumerate(counts):
        tile_end = min(6 + -(-max(n - 6, 0) // 16) * 16, WORLD * T_MAX)      # the fixed rows, then 16-row tiles
        torch.testing.assert_close(y[e, :n], want[e, :n], **(INT8_TOL if form == "int8" else BF16_TOL))
        assert (y[e, n:tile_end] == 0).all() and (y[e, tile_end:] == 7.0).all()


@pytest.mark.parametrize("form", ["bf16", "int8"])
@pytest.mark.parametrize("counts", [[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 0], [0, 5, 0, 0], [0, 0, 0, 0]])
def test_hit_experts_form_runs_only_the_experts_with_rows(form, counts):
    """rows_hint=1 with top-2 reaches at most 2 of the 4 local experts: 2 blocks run, the experts with rows first
    (an expert not run keeps out's contents); more experts with rows than the hint allows, or more rows, stay
    correct (blocks past the slots, tiles past the fixed row)."""
    cfg, weights = make(), forms(expert_weights(4, 11))[form]
    assert experts_module.hit_slots(4, 1, cfg.top_k) == 2 and experts_module.hit_slots(4, 2, cfg.top_k) == 0
    recv_x, live = dispatched(12, counts)
    out = torch.full_like(recv_x, 7.0)
    y = run_experts(cfg, weights, recv_x, live, out=out, rows_hint=1)
    want = experts_golden(cfg, weights, recv_x, live)
    for e, n in enumerate(counts):
        torch.testing.assert_close(y[e, :n], want[e, :n], **(INT8_TOL if form == "int8" else BF16_TOL))
        past = y[e, n:]                 # zeros up to the last computed row (the fixed row or a tile), then out's
        assert ((past == 0) | (past == 7.0)).all() and (y[e, 17:] == 7.0).all()
    run = [e for e in range(4) if not (y[e] == 7.0).all()]
    assert len(run) == max(2, sum(n > 0 for n in counts)), run


def test_decode_rows_follow_the_hint_up_to_the_decode_limit():
    rows = experts_module.decode_rows
    assert [rows(None, 64), rows(0, 64), rows(1, 64), rows(17, 64), rows(32, 64), rows(33, 64), rows(8, 8)] == \
        [0, 1, 1, 17, 32, 0, 8]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_other_model_dtypes(dtype, form):
    cfg = make(dtype=dtype)
    bf16 = expert_weights(4, 20)
    weights = ExpertWeights(bf16.w_gate.to(dtype), bf16.w_up.to(dtype), bf16.w_down.to(dtype))
    weights = forms(weights)[form]
    recv_x, live = dispatched(21, [4, 0, 24, 17])
    recv_x = recv_x.to(dtype)
    y = run_experts(cfg, weights, recv_x, live)
    assert y.dtype == dtype
    torch.testing.assert_close(y, experts_golden(cfg, weights, recv_x, live), rtol=2e-3, atol=2e-3)


def test_int8_tracks_the_bf16_experts_loosely():
    cfg, weights = make(), expert_weights(4, 5)
    recv_x, live = dispatched(6, [9, 24, 2, 16])
    exact = experts_golden(cfg, weights, recv_x, live).float()
    quantized = run_experts(cfg, weights.quantize(), recv_x, live).float()
    live_rows = torch.arange(WORLD * T_MAX).view(1, -1) < live.view(-1, 1)
    error = (quantized - exact)[live_rows].norm() / exact[live_rows].norm()
    assert 0 < error < 0.05, error


@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_swiglu_limit_clamps_gate_and_up(form):
    weights = forms(expert_weights(4, 7, scale=1.0))[form]    # large projections: the clamp bites
    recv_x, live = dispatched(8, [5, 24, 0, 13])
    clamped = run_experts(make(swiglu_limit=2.0), weights, recv_x, live)
    torch.testing.assert_close(clamped, experts_golden(make(swiglu_limit=2.0), weights, recv_x, live), **BF16_TOL)
    assert not torch.allclose(clamped.float(), experts_golden(make(), weights, recv_x, live).float(), atol=1.0)


@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_contractions_walked_in_k_steps(form, monkeypatch):
    monkeypatch.setattr(ffn_module, "K_TILE_MAX", 16)     # H = 32 in two steps, I = 48 in three
    cfg, weights = make(), forms(expert_weights(4, 9))[form]
    recv_x, live = dispatched(10, [7, 24, 1, 18])
    torch.testing.assert_close(run_experts(cfg, weights, recv_x, live), experts_golden(cfg, weights, recv_x, live),
                               **BF16_TOL)


@pytest.mark.parametrize("form", ["bf16", "int8"])
@pytest.mark.parametrize("tokens", [1, 16, 21])
def test_shared_expert_matches_the_golden(form, tokens):
    cfg = make(max_tokens_per_rank=32)
    weights = forms(expert_weights(1, 13, inter=64))[form]    # its own intermediate size
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(14)).bfloat16()
    y = shared_expert(cfg, weights, x)
    assert y.shape == (tokens, HIDDEN) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y, shared_expert_golden(cfg, weights, x), **BF16_TOL)


def test_shared_expert_on_zero_tokens_runs_no_kernel(monkeypatch):
    for name in ("shared_bf16_kernel", "shared_int8_kernel"):
        monkeypatch.setattr(experts_module, name, lambda shape: pytest.fail("a kernel ran for T=0"))
    weights = expert_weights(1, 15)
    for form in forms(weights).values():
        assert shared_expert(make(), form, torch.zeros(0, HIDDEN, dtype=torch.bfloat16)).shape == (0, HIDDEN)


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                              (torch.float32, torch.float32)])
@pytest.mark.parametrize("tokens", [3, 21])
def test_router_logits_match_the_fp32_gemm(x_dtype, w_dtype, tokens, monkeypatch):
    monkeypatch.setattr(ffn_module, "K_TILE_MAX", 16)     # H = 32 in two steps
    gen = torch.Generator().manual_seed(16)
    x, weight = torch.randn(tokens, HIDDEN, generator=gen).to(x_dtype), torch.randn(8, HIDDEN, generator=gen)
    logits = router_logits(weight.to(w_dtype), x)
    assert logits.dtype == torch.float32 and logits.shape == (tokens, 8)
    torch.testing.assert_close(logits, router_golden(weight.to(w_dtype), x), rtol=1e-5, atol=1e-5)


def test_router_on_zero_tokens_runs_no_kernel(monkeypatch):
    monkeypatch.setattr(router_module, "router_kernel", lambda shape: pytest.fail("a kernel ran for T=0"))
    assert router_logits(torch.zeros(8, HIDDEN), torch.zeros(0, HIDDEN)).shape == (0, 8)


def _bad_calls():
    cfg, weights = make(), expert_weights(4, 17)
    recv_x, live = dispatched(18, [1, 2, 3, 4])
    return [
        (lambda: run_experts(cfg, weights, recv_x[:, :12], live), "recv_x must be [4, 24, 32]"),
        (lambda: run_experts(cfg, weights, recv_x.float(), live), "recv_x is torch.float32"),
        (lambda: run_experts(cfg, weights, recv_x, live.long()), "counts must be an int32 tensor of 4 elements"),
        (lambda: run_experts(cfg, weights, recv_x, live, out=recv_x.float()), "out must be a contiguous"),
        (lambda: run_experts(make(hidden=64), weights, recv_x, live), "the config's hidden=64"),
        (lambda: run_experts(make(intermediate_size=64), weights, recv_x, live), "intermediate_size=64"),
        (lambda: run_experts(make(num_experts=6), weights, recv_x, live), "does not divide num_experts=6"),
        (lambda: run_experts(cfg, {"w_gate": weights.w_gate}, recv_x, live), "weights must be ExpertWeights"),
        (lambda: run_experts(make(dtype=torch.float16), weights, recv_x, live), "the config's dtype"),
        (lambda: shared_expert(cfg, weights, recv_x[0]), "must stack exactly one expert"),
        (lambda: shared_expert(cfg, expert_weights(1, 19), recv_x[0, :, :16]), "x must be a [T, 32] tensor"),
        (lambda: router_logits(torch.zeros(8, 16), recv_x[0]), "x must be a [T, 16] tensor"),
        (lambda: router_logits(torch.zeros(8, 16, dtype=torch.int8), recv_x[0]), "gate_weight must be a 2-D"),
        (lambda: ExpertWeights(weights.w_gate, weights.w_up, weights.w_down[:, :, :8]), "w_down must be [4, 32, 48]"),
        (lambda: ExpertWeights(weights.w_gate, weights.w_up.float(), weights.w_down), "w_up is torch.float32"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_arguments_are_errors_naming_them_at_the_callers_line(case):
    call, named = _bad_calls()[case]
    with pytest.raises(MoEArgumentError) as info:
        call()
    assert named in info.value.message
    assert info.value.span.file == __file__
