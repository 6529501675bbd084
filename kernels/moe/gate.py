"""The MoE gate: router logits -> (topk_idx, topk_weights), as a `@pl.jit` kernel built per gate shape.

    score  = softmax(logits) | sigmoid(logits) | sqrt(softplus(logits))        [T, E]
    choice = score + bias                      (bias steers the choice only)
    group-limited (n_group, topk_group): keep the topk_group groups with the largest top-2 sum of choice
    topk_idx     = top_k(choice)               (ties: lower expert id first)
    topk_weights = score[topk_idx] / (sum over k when norm_topk_prob) * routed_scaling_factor

One block per ROW_TILE (32) token rows (the wrapper pads T with zero logits to a multiple of ROW_TILE and drops
those rows): scores, group scores, masks and weights are row-tile vector ops; rows of up to 32 slots are sorted as
one tile (sort32 sorts each row), wider ones row by row (mrgsort takes single-row sources). A row is padded with the
most negative FP32 to a sortable width (32, 128, 512 or 2048 slots); masked groups take that same value, so with
top_k <= the kept experts (checked by MoEConfig) and no -inf in the bias (checked where it is given) neither a pad
slot nor a masked expert is ever picked.
"""

import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, describe

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
def _softmax(rows):
    shifted = pl.exp(pl.row_expand_sub(rows, pl.row_max(rows)))
    return pl.row_expand_div(shifted, pl.row_sum(shifted))


@pl.jit.inline
def _sigmoid(rows):
    return pl.recip(pl.add(pl.exp(pl.neg(rows)), 1.0))


@pl.jit.inline
def _sqrtsoftplus(rows):
    softplus = pl.add(pl.maximum(rows, 0.0), pl.log(pl.add(pl.exp(pl.neg(pl.abs(rows))), 1.0)))
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


def _row_sorter(width: int, keep: int, real: int, rows: int):
    """An inline `padded [rows, width] -> [rows, keep]`: each row's first `keep` sorted pair positions, of
    which the first `real` slots are real. sort32 takes a whole tile (every row sorted alone), so width 32 sorts the
    tile in one call, its pad slots carrying id real - 1 (never picked: see the module text; so the ids provably
    index the real slots and the pick of the scores checks no bounds); wider rows need mrgsort, which takes one row,
    so they loop over rows."""
    if width == 32:

        @pl.jit.inline
        def sort_tile(padded):
            ids = pl.col_expand(pl.full([rows, 32], dtype=pl.UINT32, value=0),
                                pl.arange(0, [1, 32], dtype=pl.UINT32))
            return pl.sort32(padded, pl.mins(ids, real - 1))[:, 0:keep]

        return sort_tile
    sort_row = SORTS[width]

    @pl.jit.inline
    def sort_rows(padded):
        best = pl.full([rows, keep], dtype=pl.FP32, value=0.0)
        for r in pl.range(rows):
            best[r : r + 1, :] = sort_row(padded[r : r + 1, :])[:, 0:keep]
        return best

    return sort_rows


@pl.jit.inline
def _renormalised(picked):
    return pl.row_expand_div(picked, pl.row_sum(picked))


@pl.jit.inline
def _unchanged(rows):
    return rows


LOWEST = float(torch.finfo(torch.float32).min)   # pl.PadValue.min for FP32: never chosen over a real score
ROW_TILE = 32                                     # token rows per block (a decode batch in one); T padded to a multiple


def _group_limiter(shape: GateShape, rows: int):
    """An inline `choice [R, E] -> choice with the experts outside each row's topk_group best groups at LOWEST`.
    A group's score is the sum of its two largest choices (the maximum twice when it occurs twice)."""
    n_group, topk_group = shape.n_group, shape.topk_group
    group_size = shape.num_experts // n_group
    group_pad = _sort_width(n_group)
    rank_groups = _row_sorter(group_pad, 2 * topk_group, n_group, rows)

    @pl.jit.inline
    def limit_groups(choice):
        ones = pl.full([rows, group_size], dtype=pl.FP32, value=1.0)
        zeros = pl.full([rows, group_size], dtype=pl.FP32, value=0.0)
        lowest = pl.full([rows, group_size], dtype=pl.FP32, value=LOWEST)
        group_best = pl.full([rows, group_pad], dtype=pl.FP32, value=LOWEST)
        for g in pl.range(n_group):
            g0 = g * group_size
            member = choice[:, g0 : g0 + group_size]
            first = pl.row_max(member)
            is_first = pl.cmp(member, pl.row_expand(member, first), cmp_type=0)
            repeats = pl.row_sum(pl.sel(is_first, ones, zeros))
            second = pl.row_max(pl.sel(is_first, lowest, member))
            second = pl.sel(pl.cmps(repeats, 1.5, cmp_type=4), first, second)
            group_best[:, g : g + 1] = pl.add(first, second)
        chosen = pl.gather(rank_groups(group_best), mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
        chosen_ones = pl.full([rows, topk_group], dtype=pl.FP32, value=1.0)
        chosen_zeros = pl.full([rows, topk_group], dtype=pl.FP32, value=0.0)
        kept = pl.full([rows, n_group * group_size], dtype=pl.FP32, value=LOWEST)
        for g in pl.range(n_group):
            g0 = g * group_size
            member = choice[:, g0 : g0 + group_size]
            was_chosen = pl.row_sum(pl.sel(pl.cmps(chosen, g, cmp_type=0), chosen_ones, chosen_zeros))
            keep = pl.cmps(pl.row_expand(member, was_chosen), 0.5, cmp_type=4)
            kept[:, g0 : g0 + group_size] = pl.sel(keep, member, lowest)
        return kept

    return limit_groups


@pl.jit.inline
def _pick_scores(score, idx):
    """score [R, E] at each row's chosen experts idx [R, K] INT32 -> [R, K] (one index-form gather: a tile op, so
    no data is read into the program and a call can replay)."""
    return pl.gather(score, dim=-1, index=idx)


def _scaled(factor: float):
    """An inline `tile -> tile * factor`, the identity for 1.0 (no torch call in a replay)."""
    if factor == 1.0:
        return _unchanged

    @pl.jit.inline
    def scaled(tile):
        return pl.mul(tile, factor)

    return scaled


def route_tile(shape: GateShape, rows: int = ROW_TILE):
    """The inline `(logits [rows, E] FP32 tile, bias [1, E] FP32) -> (topk_idx [rows, K] INT32,
    topk_weights [rows, K] FP32)`: the gate of one tile of token rows (`gate_kernel`'s body; kernels that
    fuse the gate with what surrounds it call it too, on as many rows as they have)."""
    expert_pad = _sort_width(shape.num_experts)
    sort_experts = _row_sorter(expert_pad, 2 * shape.top_k, shape.num_experts, rows)
    score_of = SCORES[shape.score_func]
    limit = _group_limiter(shape, rows) if shape.n_group is not None else _unchanged
    finish = _renormalised if shape.norm_topk_prob else _unchanged
    scale = _scaled(shape.routed_scaling_factor)

    @pl.jit.inline
    def route(logits, bias):
        score = score_of(logits)
        choice = limit(pl.col_expand_add(score, bias))
        padded = pl.fillpad_expand(choice, [rows, expert_pad], pad_value=pl.PadValue.min)
        chosen = pl.gather(sort_experts(padded), mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
        return chosen, scale(finish(_pick_scores(score, chosen)))

    return route


@functools.lru_cache(maxsize=None)
def gate_kernel(shape: GateShape):
    """The compiled-once `@pl.jit` gate for one GateShape: logits [T, E] FP32 with T a multiple of ROW_TILE,
    bias [1, E] FP32."""
    n_experts, top_k = shape.num_experts, shape.top_k
    route = route_tile(shape)

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
        for tb in pl.spmd(t_dim // ROW_TILE, name_hint="moe_gate"):
            t0 = tb * ROW_TILE
            chosen, weights = route(logits[t0 : t0 + ROW_TILE, :], bias)
            topk_idx[t0 : t0 + ROW_TILE, :] = chosen
            topk_weights[t0 : t0 + ROW_TILE, :] = weights
        return topk_idx, topk_weights

    return moe_gate


def gate(cfg: MoEConfig, logits: torch.Tensor, bias: torch.Tensor | None = None):
    """Route `logits` [T, num_experts] (T <= max_tokens_per_rank; any float dtype, computed in FP32) with an
    optional selection bias [num_experts]. Returns (topk_idx [T, top_k] int32, topk_weights [T, top_k] float32)."""
    logits, bias = _checked_inputs(cfg, logits, bias)
    tokens = logits.shape[0]
    rows = -(-tokens // ROW_TILE) * ROW_TILE
    topk_idx = torch.zeros(rows, cfg.top_k, dtype=torch.int32)
    topk_weights = torch.zeros(rows, cfg.top_k, dtype=torch.float32)
    if tokens:
        if rows != tokens:
            logits = torch.cat([logits, logits.new_zeros(rows - tokens, cfg.num_experts)])
        gate_kernel(GateShape.of(cfg))(logits, bias, topk_idx, topk_weights)
    return topk_idx[:tokens], topk_weights[:tokens]


def _checked_inputs(cfg: MoEConfig, logits, bias):
    """(logits [T, E] FP32 contiguous, bias [1, E] FP32 contiguous); an error naming the argument otherwise."""
    experts = cfg.num_experts
    bad = MoEArgumentError.at_caller
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != experts:
        raise bad(f"gate: logits must be a [T, {experts}] tensor (num_experts={experts}), got {describe(logits)}")
    if not logits.is_floating_point():
        raise bad(f"gate: logits must be floating point, got {logits.dtype}")
    if logits.shape[0] > cfg.max_tokens_per_rank:
        raise bad(f"gate: logits has {logits.shape[0]} tokens, over max_tokens_per_rank={cfg.max_tokens_per_rank}",
                  hint="split the batch or raise max_tokens_per_rank")
    if bias is None:
        bias = torch.zeros(experts)
    elif not isinstance(bias, torch.Tensor) or bias.numel() != experts or not bias.is_floating_point():
        raise bad(f"gate: bias must be a floating-point tensor of {experts} elements (num_experts), "
                  f"got {describe(bias)}")
    check_bias(bias, "gate")
    return logits.float().contiguous(), bias.float().reshape(1, experts).contiguous()


def check_bias(bias: torch.Tensor | None, where: str) -> None:
    """An error unless the selection bias is free of -inf: with one, an expert could rank below the pad slots of a
    sorted row (at the most negative FP32), which the gate assumes never win."""
    if bias is not None and bool(torch.isneginf(bias).any()):
        expert = int(torch.isneginf(bias.reshape(-1)).nonzero()[0])
        raise MoEArgumentError.at_caller(f"{where}: the selection bias is -inf at expert {expert}",
                                         hint="keep an expert out with a large finite negative bias (e.g. -1e30)")
