"""The gate kernel against its torch golden, on both executors: indices exactly, weights within FP32 tolerance."""
import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.kernels.moe import MoEArgumentError, MoEConfig
from pypto_rt.kernels.moe import gate as gate_module
from pypto_rt.kernels.moe.gate import gate
from pypto_rt.kernels.moe.golden import gate_golden

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(params=["reference", "compiled"], autouse=True)
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


def make(**changes) -> MoEConfig:
    return MoEConfig(**{**dict(hidden=32, num_experts=16, top_k=4, max_tokens_per_rank=8), **changes})


def routed(cfg, logits, bias=None):
    """The kernel's result, checked against the golden; returned for further checks."""
    idx, weights = gate(cfg, logits, bias)
    want_idx, want_weights = gate_golden(cfg, logits, bias)
    assert idx.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(idx, want_idx), (idx, want_idx)
    torch.testing.assert_close(weights, want_weights, **TOL)
    return idx, weights


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_each_score_function_matches_the_golden(score_func):
    cfg = make(score_func=score_func)
    routed(cfg, torch.randn(6, 16, generator=torch.Generator().manual_seed(1)) * 3)


@pytest.mark.parametrize("experts, top_k", [(8, 2), (64, 6)])
def test_expert_counts_that_need_padding_to_a_sort_width(experts, top_k):
    cfg = make(num_experts=experts, top_k=top_k)
    routed(cfg, torch.randn(3, experts, generator=torch.Generator().manual_seed(2)))


@pytest.mark.parametrize("groups, sorts", [({}, 1), (dict(n_group=4, topk_group=2), 2)])
def test_rows_of_up_to_32_slots_are_sorted_as_one_tile(groups, sorts, monkeypatch):
    from pypto_rt.ops import registry
    calls = []
    for name in ("sort32", "tile.sort32", "tensor.sort32"):
        monkeypatch.setitem(registry.OPS, name, lambda *a, _op=registry.OPS[name], **k: calls.append(1) or _op(*a, **k))
    cfg = make(routed_scaling_factor=1.25, max_tokens_per_rank=32, **groups)    # a gate shape of its own: its
    routed(cfg, torch.randn(32, 16, generator=torch.Generator().manual_seed(5)))  # first call runs the ops
    assert len(calls) == sorts     # 32 tokens in one block, the experts' sort (and the groups') once, not per row


def test_tokens_over_several_blocks_the_last_one_padded():
    tokens = gate_module.ROW_TILE + 9
    routed(make(max_tokens_per_rank=tokens), torch.randn(tokens, 16, generator=torch.Generator().manual_seed(6)))


def test_bias_changes_the_selection_but_not_the_weights():
    cfg = make(score_func="sigmoid", norm_topk_prob=False)
    logits = torch.randn(5, 16, generator=torch.Generator().manual_seed(3))
    bias = torch.zeros(16)
    bias[[3, 11]] = 10.0
    plain_idx, _ = routed(cfg, logits)
    idx, weights = routed(cfg, logits, bias)
    assert not torch.equal(idx, plain_idx)
    assert (idx == 3).any(dim=1).all() and (idx == 11).any(dim=1).all()
    torch.testing.assert_close(weights, logits.sigmoid().gather(1, idx.long()), **TOL)


def test_group_limited_topk_keeps_only_the_best_groups():
    cfg = make(score_func="sigmoid", n_group=4, topk_group=2, top_k=4)
    logits = torch.full((2, 16), -4.0)
    # token 0: groups 0 and 2 have the two best top-2 sums; group 1 holds the single best expert
    logits[0, [0, 1, 8, 9, 4]] = torch.tensor([2.0, 2.0, 1.5, 1.5, 3.0])
    # token 1: one strong expert per group; groups 3 and 1 win on their second expert
    logits[1, [12, 13, 5, 6, 0, 9]] = torch.tensor([1.0, 1.0, 1.0, 0.9, 2.5, 2.5])
    idx, _ = routed(cfg, logits)
    assert sorted(idx[0].tolist()) == [0, 1, 8, 9]
    assert sorted(idx[1].tolist()) == [5, 6, 12, 13]
    ungrouped = make(score_func="sigmoid", top_k=4)
    assert not torch.equal(idx, routed(ungrouped, logits)[0])


@pytest.mark.parametrize("experts, n_group, topk_group, top_k", [(256, 8, 4, 8), (16, 8, 5, 4)])
def test_group_limited_with_bias(experts, n_group, topk_group, top_k):
    cfg = make(num_experts=experts, top_k=top_k, n_group=n_group, topk_group=topk_group, score_func="sigmoid",
               routed_scaling_factor=2.5)     # (256, 8, 4, 8): DeepSeek-V3's routing
    gen = torch.Generator().manual_seed(4)
    idx, weights = routed(cfg, torch.randn(3, experts, generator=gen), torch.randn(experts, generator=gen) * 0.1)
    assert all(len(set((row // (experts // n_group)).tolist())) <= topk_group for row in idx)
    torch.testing.assert_close(weights.sum(dim=1), torch.full((3,), 2.5), **TOL)


@pytest.mark.parametrize("norm", [True, False])
def test_renormalisation_on_and_off(norm):
    cfg = make(score_func="softmax", norm_topk_prob=norm)
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(5))
    idx, weights = routed(cfg, logits)
    sums = weights.sum(dim=1)
    if norm:
        torch.testing.assert_close(sums, torch.ones(4), **TOL)
    else:
        torch.testing.assert_close(weights, logits.softmax(-1).gather(1, idx.long()), **TOL)
        assert (sums < 1).all()


def test_routed_scaling_factor_multiplies_the_weights():
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(6))
    _, unscaled = routed(make(score_func="sqrtsoftplus"), logits)
    _, scaled = routed(make(score_func="sqrtsoftplus", routed_scaling_factor=1.5), logits)
    torch.testing.assert_close(scaled, unscaled * 1.5, **TOL)


def test_zero_tokens_returns_empty_results_without_a_kernel(monkeypatch):
    monkeypatch.setattr(gate_module, "gate_kernel", lambda shape: pytest.fail("a kernel ran for T=0"))
    idx, weights = gate(make(), torch.zeros(0, 16))
    assert idx.shape == (0, 4) and idx.dtype == torch.int32
    assert weights.shape == (0, 4) and weights.dtype == torch.float32


def test_one_token_and_a_full_batch_of_bf16_logits():
    cfg = make()
    routed(cfg, torch.randn(1, 16, generator=torch.Generator().manual_seed(7)))
    routed(cfg, torch.randn(8, 16, generator=torch.Generator().manual_seed(8)).bfloat16())


def test_ties_go_to_the_lowest_expert_id():
    cfg = make(score_func="sigmoid", norm_topk_prob=False, top_k=3)
    logits = torch.zeros(3, 16)
    logits[1, [9, 4, 12, 2]] = 1.0             # four tied best experts: the three lowest ids win
    logits[2, [15, 7]] = 2.0
    logits[2, [13, 5, 10]] = 1.0               # one slot left for three tied experts
    idx, _ = routed(cfg, logits)
    assert idx.tolist() == [[0, 1, 2], [2, 4, 9], [7, 15, 5]]


def test_tied_groups_go_to_the_lowest_group_id():
    cfg = make(score_func="sigmoid", norm_topk_prob=False, n_group=4, topk_group=1, top_k=2)
    logits = torch.zeros(1, 16)
    logits[0, [13, 14, 5, 6]] = 1.0            # groups 3 and 1 tie on their top-2 sum
    idx, _ = routed(cfg, logits)
    assert idx.tolist() == [[5, 6]]


@pytest.mark.parametrize("logits, bias, named", [
    (torch.zeros(9, 16), None, "9 tokens, over max_tokens_per_rank=8"),
    (torch.zeros(2, 15), None, "logits must be a [T, 16] tensor (num_experts=16), got torch.float32 [2, 15]"),
    (torch.zeros(2, 16, dtype=torch.int32), None, "logits must be floating point"),
    (torch.zeros(2, 16), torch.zeros(8), "bias must be a floating-point tensor of 16 elements"),
    (torch.zeros(2, 16), torch.zeros(16).index_fill(0, torch.tensor([3]), -float("inf")),
     "gate: the selection bias is -inf at expert 3"),
])
def test_bad_inputs_are_errors_naming_the_argument(logits, bias, named):
    with pytest.raises(MoEArgumentError) as info:
        gate(make(), logits, bias)
    assert named in info.value.message
    assert info.value.span.file == __file__    # the caller's line, not the library's
    assert f" --> {__file__}:" in str(info.value)


def test_a_group_whose_best_expert_occurs_twice_scores_it_twice():
    cfg = make(score_func="sigmoid", norm_topk_prob=False, n_group=4, topk_group=1, top_k=2)
    logits = torch.full((1, 16), -3.0)
    logits[0, [8, 9]] = 1.0                    # group 2: top-2 sum 2 * sigmoid(1.0) = 1.462
    logits[0, [4, 5]] = torch.tensor([1.2, 0.8])   # group 1: sigmoid(1.2) + sigmoid(0.8) = 1.459
    idx, _ = routed(cfg, logits)
    assert idx.tolist() == [[8, 9]]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("groups", [None, 4], ids=["flat", "grouped"])
def test_the_route_of_a_few_rows_matches_the_golden(rows, groups):
    """route_tile on as many rows as a fused kernel has (no padding to ROW_TILE)."""
    cfg = make(score_func="sigmoid", n_group=groups, topk_group=groups and 2)
    experts, top_k = cfg.num_experts, cfg.top_k
    route = gate_module.route_tile(gate_module.GateShape.of(cfg), rows=rows)

    @pl.jit
    def few_rows(logits: pl.Tensor[[rows, experts], pl.FP32], bias: pl.Tensor[[1, experts], pl.FP32],
                 idx: pl.Out[pl.Tensor[[rows, top_k], pl.INT32]], weights: pl.Out[pl.Tensor[[rows, top_k], pl.FP32]]):
        for _ in pl.spmd(1, name_hint="few_rows"):
            chosen, picked = route(logits[0:rows, :], bias)
            idx[:, :] = chosen
            weights[:, :] = picked
        return idx, weights

    gen = torch.Generator().manual_seed(rows)
    logits, bias = torch.randn(rows, experts, generator=gen), torch.randn(experts, generator=gen) * 0.1
    idx, weights = torch.zeros(rows, top_k, dtype=torch.int32), torch.zeros(rows, top_k)
    few_rows(logits, bias.reshape(1, experts), idx, weights)
    want_idx, want_weights = gate_golden(cfg, logits, bias)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(weights, want_weights, **TOL)
