"""Torch goldens for the MoE kernels, written from the published semantics (Mixtral, DeepSeek-V3), not from the
kernels. Ties in every top-k go to the lower id (a stable descending sort), as the kernels' sort does."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.ffn import AMAX_EPS


def _scores(score_func: str, logits: torch.Tensor) -> torch.Tensor:
    if score_func == "softmax":
        return logits.softmax(dim=-1)
    if score_func == "sigmoid":
        return logits.sigmoid()
    return F.softplus(logits).sqrt()


def _top(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries per row, ties to the lower index."""
    return torch.argsort(values, dim=-1, descending=True, stable=True)[:, :k]


def _limit_groups(cfg: MoEConfig, choice: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3 group-limited routing: keep the topk_group groups whose top-2 sum is largest, -inf the rest."""
    tokens = choice.shape[0]
    grouped = choice.view(tokens, cfg.n_group, -1)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros(tokens, cfg.n_group, dtype=torch.bool)
    keep.scatter_(1, _top(group_scores, cfg.topk_group), True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, -1)


def gate_golden(cfg: MoEConfig, logits: torch.Tensor, bias: torch.Tensor | None = None):
    """Router logits [T, E] -> (topk_idx [T, K] int32, topk_weights [T, K] float32). The bias only steers the
    choice; the weights are the unbiased scores of the chosen experts (renormalised when norm_topk_prob) times
    routed_scaling_factor."""
    scores = _scores(cfg.score_func, logits.float())
    choice = scores if bias is None else scores + bias.float().view(1, -1)
    if cfg.grouped:
        choice = _limit_groups(cfg, choice)
    idx = _top(choice, cfg.top_k)
    weights = scores.gather(1, idx)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return idx.to(torch.int32), weights * cfg.routed_scaling_factor


def router_golden(gate_weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Router logits [T, E] = x @ gate_weight.T in FP32 (DeepSeek-V3 computes its gate in FP32)."""
    return x.float() @ gate_weight.float().T


def _quantized_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: (q [R, K] as int64, scale [R, 1]) with rows ~= q * scale, scale = amax / 127."""
    scale = rows.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_EPS) * (1.0 / 127.0)
    return torch.round(rows * scale.reciprocal()).long(), scale


def _swiglu(cfg: MoEConfig, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    limit = cfg.swiglu_limit
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return F.silu(gate) * up


def ffn_golden(cfg: MoEConfig, weights, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert `e` of `weights` (ExpertWeights or QuantizedExpertWeights) on rows x [n, H], in cfg.dtype.
    bf16: FP32 accumulation, h rounded to cfg.dtype before the down projection (a linear layer's output).
    int8 (W8A8): x and h quantised per row, int8 products summed exactly, dequantised by row x channel scale."""
    if not weights.quantized:
        gate = x.float() @ weights.w_gate[e].float().T
        up = x.float() @ weights.w_up[e].float().T
        h = _swiglu(cfg, gate, up).to(cfg.dtype)
        return (h.float() @ weights.w_down[e].float().T).to(cfg.dtype)
    xq, x_scale = _quantized_rows(x.float())
    gate = (xq @ weights.w_gate[e].long().T).float() * x_scale * weights.gate_scale[e]
    up = (xq @ weights.w_up[e].long().T).float() * x_scale * weights.up_scale[e]
    hq, h_scale = _quantized_rows(_swiglu(cfg, gate, up))
    return ((hq @ weights.w_down[e].long().T).float() * h_scale * weights.down_scale[e]).to(cfg.dtype)


def experts_golden(cfg: MoEConfig, weights, recv_x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The routed experts on the dispatch layout: y[e, :counts[e]] = expert e's FFN of recv_x[e, :counts[e]];
    the rows past counts[e] are zero."""
    y = torch.zeros_like(recv_x)
    for e, n in enumerate(counts.tolist()):
        y[e, :n] = ffn_golden(cfg, weights, e, recv_x[e, :n])
    return y


def shared_expert_golden(cfg: MoEConfig, weights, x: torch.Tensor) -> torch.Tensor:
    """The shared expert (one stacked expert) on the tokens x [T, H]."""
    return ffn_golden(cfg, weights, 0, x)


def moe_layer_golden(cfg: MoEConfig, weights, x: torch.Tensor) -> torch.Tensor:
    """A whole MoE layer on one process: `weights` holds every expert (`load_moe_weights(..., rank=0, world=1)`).
    out[t] = sum_k w[t, k] * expert_{e[t, k]}(x[t]) (+ shared(x[t])), summed in FP32 and rounded once."""
    logits = router_golden(weights.router.weight, x)
    topk_idx, topk_weights = gate_golden(cfg, logits, weights.router.bias)
    total = torch.zeros(x.shape[0], cfg.hidden)
    for t in range(x.shape[0]):
        for k in range(cfg.top_k):
            row = ffn_golden(cfg, weights.experts, int(topk_idx[t, k]), x[t:t + 1])
            total[t] += topk_weights[t, k] * row[0].float()
    if weights.shared is not None:
        total += shared_expert_golden(cfg, weights.shared, x).float()
    return total.to(cfg.dtype)
