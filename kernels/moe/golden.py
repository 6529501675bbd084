"""Torch goldens for the MoE kernels, written from the published semantics (Mixtral, DeepSeek-V3), not from the
kernels. Ties in every top-k go to the lower id (a stable descending sort), as the kernels' sort does."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pypto_rt.kernels.moe.config import MoEConfig


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
