"""The MoE gate: router logits -> (topk_idx, topk_weights), as a `@pl.jit` kernel built per gate shape.

    score  = softmax(logits) | sigmoid(logits) | sqrt(softplus(logits))        [T, E]
    choice = score + bias                      (bias steers the choice only)
    group-limited (n_group, topk_group): keep the topk_group groups with the largest top-2 sum of choice
    topk_idx     = top_k(choice)               (ties: lower expert id first)
    topk_weights = score[topk_idx] / (sum over k when norm_topk_prob) * routed_scaling_factor

One block per token row: sort32 + mrgsort need single-row sources, so the row is padded with the most negative
FP32 to a sortable width (32, 128, 512 or 2048 slots). Masked groups take that same value, so with top_k <= the
kept experts (checked by MoEConfig) neither a pad slot nor a masked expert is ever picked.
"""

import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.errors import MoEArgumentError

T_DYN = pl.dynamic("T_DYN")
SORT_WIDTHS = (32, 128, 512, 2048)      # sort32 runs, then each mrgsort merges four runs


@dataclass(frozen=True)
class GateShape:
    """What the compiled gate kernel depends on: everything in MoEConfig but the token count and payload."""
    num_experts: int
    top_k: int
    score_func: str
    n_group: int | None
    topk_group: int | None
    norm_topk_prob: bool
    routed_scaling_factor: float

    @classmethod
    def of(cls, cfg: MoEConfig) -> "GateShape":
        return cls(cfg.num_experts, cfg.top_k, cfg.score_func, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob,
                   float(cfg.routed_scaling_factor))


def _sort_width(n: int) -> int:
    return next(w for w in SORT_WIDTHS if w >= n)


@pl.jit.inline
def _softmax(row):
    shifted = pl.exp(pl.row_expand_sub(row, pl.row_max(row)))
    return pl.row_expand_div(shifted, pl.row_sum(shifted))


@pl.jit.inline
def _sigmoid(row):
    return pl.recip(pl.add(pl.exp(pl.neg(row)), 1.0))


@pl.jit.inline
def _sqrtsoftplus(row):
    softplus = pl.add(pl.maximum(row, 0.0), pl.log(pl.add(pl.exp(pl.neg(pl.abs(row))), 1.0)))
    return pl.sqrt(softplus)


SCORES = {"softmax": _softmax, "sigmoid": _sigmoid, "sqrtsoftplus": _sqrtsoftplus}


@pl.jit.inline
def _sort_32(padded):
    return pl.sort32(padded, pl.arange(0, [1, 32], dtype=pl.UINT32))


@pl.jit.inline
def _sort_128(padded):
    pairs = pl.sort32(padded, pl.arange(0, [1, 128], dtype=pl.UINT32))
    return pl.mrgsort(pairs, block_len=64)


@pl.jit.inline
def _sort_512(padded):
    pairs = pl.sort32(padded, pl.arange(0, [1, 512], dtype=pl.UINT32))
    pairs = pl.mrgsort(pairs, block_len=64)
    return pl.mrgsort(pairs, block_len=256)


@pl.jit.inline
def _sort_2048(padded):
    pairs = pl.sort32(padded, pl.arange(0, [1, 2048], dtype=pl.UINT32))
    pairs = pl.mrgsort(pairs, block_len=64)
    pairs = pl.mrgsort(pairs, block_len=256)
    return pl.mrgsort(pairs, block_len=1024)


SORTS = {32: _sort_32, 128: _sort_128, 512: _sort_512, 2048: _sort_2048}


@pl.jit.inline
def _renormalised(picked):
    return pl.row_expand_div(picked, pl.row_sum(picked))


@pl.jit.inline
def _unchanged(row):
    return row


LOWEST = float(torch.finfo(torch.float32).min)   # pl.PadValue.min for FP32: never chosen over a real score


def _group_limiter(shape: GateShape):
    """An inline `choice [1, E] -> choice with the experts outside the topk_group best groups set to LOWEST`."""
    n_group, topk_group = shape.n_group, shape.topk_group
    group_size = shape.num_experts // n_group
    sort_member = SORTS[_sort_width(group_size)]
    member_pad = _sort_width(group_size)
    group_pad = _sort_width(n_group)

    @pl.jit.inline
    def limit_groups(choice):
        group_best = pl.full([1, group_pad], dtype=pl.FP32, value=LOWEST)
        for g in pl.range(n_group):
            g0 = g * group_size
            member = pl.fillpad_expand(choice[:, g0 : g0 + group_size], [1, member_pad], pad_value=pl.PadValue.min)
            top2 = pl.gather(sort_member(member)[:, 0:4], mask_pattern=pl.tile.MaskPattern.P0101)
            group_best[:, g : g + 1] = pl.row_sum(top2)
        ranked = _sort_32(group_best)[:, 0 : 2 * topk_group]
        chosen = pl.gather(ranked, mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
        ones = pl.full([1, topk_group], dtype=pl.FP32, value=1.0)
        zeros = pl.full([1, topk_group], dtype=pl.FP32, value=0.0)
        lowest = pl.full([1, group_size], dtype=pl.FP32, value=LOWEST)
        kept = pl.full([1, n_group * group_size], dtype=pl.FP32, value=LOWEST)
        for g in pl.range(n_group):
            g0 = g * group_size
            member = choice[:, g0 : g0 + group_size]
            was_chosen = pl.row_sum(pl.sel(pl.cmps(chosen, g, cmp_type=0), ones, zeros))   # [1, 1]: 1.0 or 0.0
            keep = pl.cmps(pl.row_expand(member, was_chosen), 0.5, cmp_type=4)
            kept[:, g0 : g0 + group_size] = pl.sel(keep, member, lowest)
        return kept

    return limit_groups


def _score_picker(n_experts: int, top_k: int):
    """An inline `(score [1, E], idx [1, K] INT32) -> score[idx] [1, K]`: a one-hot [E, K] matmul, exact since
    every column has a single 1, and free of reads of data into the program (so a call can replay)."""

    @pl.jit.inline
    def pick_scores(score, idx):
        experts = pl.reshape(pl.arange(0, [1, n_experts], dtype=pl.INT32), [n_experts, 1])
        slots = pl.full([n_experts, top_k], dtype=pl.INT32, value=0)
        hit = pl.cmp(pl.row_expand(slots, experts), pl.col_expand(slots, idx), cmp_type=0)
        one_hot = pl.sel(hit, pl.full([n_experts, top_k], dtype=pl.FP32, value=1.0),
                         pl.full([n_experts, top_k], dtype=pl.FP32, value=0.0))
        return pl.matmul(score, one_hot)

    return pick_scores


@functools.lru_cache(maxsize=None)
def gate_kernel(shape: GateShape):
    """The compiled-once `@pl.jit` gate for one GateShape (logits [T, E] FP32, bias [1, E] FP32)."""
    n_experts, top_k = shape.num_experts, shape.top_k
    expert_pad = _sort_width(n_experts)
    score_of, sort_experts = SCORES[shape.score_func], SORTS[expert_pad]
    limit = _group_limiter(shape) if shape.n_group is not None else _unchanged
    pick_scores = _score_picker(n_experts, top_k)
    finish = _renormalised if shape.norm_topk_prob else _unchanged
    scale = shape.routed_scaling_factor

    @pl.jit
    def moe_gate(
        logits: pl.Tensor[[T_DYN, n_experts], pl.FP32],
        bias: pl.Tensor[[1, n_experts], pl.FP32],
        topk_idx: pl.Out[pl.Tensor[[T_DYN, top_k], pl.INT32]],
        topk_weights: pl.Out[pl.Tensor[[T_DYN, top_k], pl.FP32]],
    ):
        logits.bind_dynamic(0, T_DYN)
        topk_idx.bind_dynamic(0, T_DYN)
        topk_weights.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(logits, 0)
        for t in pl.spmd(t_dim, name_hint="moe_gate"):
            score = score_of(logits[t : t + 1, :])
            choice = limit(pl.add(score, bias))
            padded = pl.fillpad_expand(choice, [1, expert_pad], pad_value=pl.PadValue.min)
            best = sort_experts(padded)[:, 0 : 2 * top_k]
            chosen = pl.gather(best, mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
            topk_idx[t : t + 1, :] = chosen
            picked = pick_scores(score, chosen)
            topk_weights[t : t + 1, :] = pl.mul(finish(picked), scale)
        return topk_idx, topk_weights

    return moe_gate


def gate(cfg: MoEConfig, logits: torch.Tensor, bias: torch.Tensor | None = None):
    """Route `logits` [T, num_experts] (T <= max_tokens_per_rank; any float dtype, computed in FP32) with an
    optional selection bias [num_experts]. Returns (topk_idx [T, top_k] int32, topk_weights [T, top_k] float32)."""
    logits, bias = _checked_inputs(cfg, logits, bias)
    tokens = logits.shape[0]
    topk_idx = torch.zeros(tokens, cfg.top_k, dtype=torch.int32)
    topk_weights = torch.zeros(tokens, cfg.top_k, dtype=torch.float32)
    if tokens:
        gate_kernel(GateShape.of(cfg))(logits, bias, topk_idx, topk_weights)
    return topk_idx, topk_weights


def _checked_inputs(cfg: MoEConfig, logits, bias):
    """(logits [T, E] FP32 contiguous, bias [1, E] FP32 contiguous); an error naming the argument otherwise."""
    experts = cfg.num_experts
    bad = MoEArgumentError.at_caller
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != experts:
        raise bad(f"gate: logits must be a [T, {experts}] tensor (num_experts={experts}), got {_describe(logits)}")
    if not logits.is_floating_point():
        raise bad(f"gate: logits must be floating point, got {logits.dtype}")
    if logits.shape[0] > cfg.max_tokens_per_rank:
        raise bad(f"gate: logits has {logits.shape[0]} tokens, over max_tokens_per_rank={cfg.max_tokens_per_rank}",
                  hint="split the batch or raise max_tokens_per_rank")
    if bias is None:
        bias = torch.zeros(experts)
    elif not isinstance(bias, torch.Tensor) or bias.numel() != experts or not bias.is_floating_point():
        raise bad(f"gate: bias must be a floating-point tensor of {experts} elements (num_experts), "
                  f"got {_describe(bias)}")
    return logits.float().contiguous(), bias.float().reshape(1, experts).contiguous()


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__
