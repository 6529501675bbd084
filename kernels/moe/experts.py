"""Routed experts over the dispatch layout, and the shared expert, as `@pl.jit` kernels built per shape.

Routed: recv_x [E_local, R, H] holds each local expert's rows packed from row 0, counts [E_local] INT32 how many
are live. Block b of the spmd serves expert b // EXPERT_SPLIT and its row tiles b % EXPERT_SPLIT,
+ EXPERT_SPLIT, ... below the live count, which the block reads itself (pl.read inside the region: the host
program never reads device data). A tile's rows past the count are zeroed on load, so their results are zeros:
y's rows past counts[e] are zeros in the last live tile and keep what `out` held after it (all zeros when the
wrapper allocates `out`). The last tile of an expert may overhang R: only its rows below R are stored.

Decode forms (RoutedShape.fixed_rows > 0, when the caller bounds every count by at most DECODE_ROWS_MAX rows;
experts_decode.py), both replaying whatever the routing: every local expert's first fixed_rows rows in one block
of batched tile ops, or, when the bound's routes reach at most half the experts (batch 1), one block per expert
with rows, its id read from data, so only the hit experts' weights are read.

Shared: the same FFN on the local tokens x [T, H], one block per ROW_TILE rows, the last one partial.
"""

import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe.ffn import PL_DTYPES, ROW_TILE, FfnShape, bf16_ffn, cast_to, int8_ffn
from pypto_rt.kernels.moe.experts_decode import (
    SORT_WIDTH, expert_slots_kernel, routed_bf16_decode, routed_int8_decode, routed_slots_kernel,
)
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, describe
from pypto_rt.kernels.moe.routed_shape import RoutedShape, live_rows as live_rows_of
from pypto_rt.kernels.moe.weights import ExpertWeights, QuantizedExpertWeights

EXPERT_SPLIT = 4            # spmd blocks per local expert: a skewed expert's tiles still spread over workers
DECODE_ROWS_MAX = 32        # the largest row bound served by the decode form (its one tile per expert)
T_DYN = pl.dynamic("T_DYN")


def routed_bf16(shape: RoutedShape):
    """The inline `(recv_x, counts, w_gate, w_up, w_down, y) -> y` of the bf16 routed experts (for kernels that
    compose it, e.g. with dispatch and combine); `routed_bf16_kernel` is its `@pl.jit` entry."""
    if shape.fixed_rows:
        return routed_bf16_decode(shape)
    n_local, rows, hidden, split = shape.n_local, shape.rows, shape.ffn.hidden, shape.split
    dt = PL_DTYPES[shape.ffn.dtype]
    ffn, to_out, live_rows = bf16_ffn(shape.ffn), cast_to(pl.FP32, dt), live_rows_of(hidden, dt)

    @pl.jit.inline
    def routed_experts(recv_x, counts, w_gate, w_up, w_down, y):
        for blk in pl.spmd(n_local * split, name_hint="moe_experts"):
            e = blk // split
            live = pl.min(pl.read(counts, [e]), rows)
            for tb in pl.range(blk % split, (live + ROW_TILE - 1) // ROW_TILE, split):
                t0 = tb * ROW_TILE
                x = live_rows(recv_x[e, t0 : t0 + ROW_TILE, :], live - t0)
                y_tile = to_out(ffn(x, w_gate[e, :, :], w_up[e, :, :], w_down[e, :, :]))
                y[e, t0 : t0 + ROW_TILE, :] = pl.set_validshape(y_tile, pl.min(ROW_TILE, rows - t0), hidden)
        return y

    return routed_experts


def routed_int8(shape: RoutedShape):
    """The inline `(recv_x, counts, w_gate, gate_scale, w_up, up_scale, w_down, down_scale, y) -> y` of the W8A8
    routed experts; `routed_int8_kernel` is its `@pl.jit` entry."""
    if shape.fixed_rows:
        return routed_int8_decode(shape)
    n_local, rows, hidden, split = shape.n_local, shape.rows, shape.ffn.hidden, shape.split
    dt = PL_DTYPES[shape.ffn.dtype]
    ffn, to_out, live_rows = int8_ffn(shape.ffn), cast_to(pl.FP32, dt), live_rows_of(hidden, dt)

    @pl.jit.inline
    def routed_experts_int8(recv_x, counts, w_gate, gate_scale, w_up, up_scale, w_down, down_scale, y):
        for blk in pl.spmd(n_local * split, name_hint="moe_experts_int8"):
            e = blk // split
            live = pl.min(pl.read(counts, [e]), rows)
            for tb in pl.range(blk % split, (live + ROW_TILE - 1) // ROW_TILE, split):
                t0 = tb * ROW_TILE
                x = live_rows(recv_x[e, t0 : t0 + ROW_TILE, :], live - t0)
                y_tile = ffn(x, w_gate[e, :, :], gate_scale[e : e + 1, :], w_up[e, :, :], up_scale[e : e + 1, :],
                             w_down[e, :, :], down_scale[e : e + 1, :])
                y[e, t0 : t0 + ROW_TILE, :] = pl.set_validshape(to_out(y_tile), pl.min(ROW_TILE, rows - t0), hidden)
        return y

    return routed_experts_int8


@functools.lru_cache(maxsize=None)
def routed_bf16_kernel(shape: RoutedShape):
    n_local, rows, hidden, inter = shape.n_local, shape.rows, shape.ffn.hidden, shape.ffn.inter
    dt = PL_DTYPES[shape.ffn.dtype]
    routed_experts = routed_bf16(shape)

    @pl.jit
    def moe_experts(
        recv_x: pl.Tensor[[n_local, rows, hidden], dt],
        counts: pl.Tensor[[n_local], pl.INT32],
        w_gate: pl.Tensor[[n_local, inter, hidden], dt],
        w_up: pl.Tensor[[n_local, inter, hidden], dt],
        w_down: pl.Tensor[[n_local, hidden, inter], dt],
        y: pl.Out[pl.Tensor[[n_local, rows, hidden], dt]],
    ):
        routed_experts(recv_x, counts, w_gate, w_up, w_down, y)
        return y

    return moe_experts


@functools.lru_cache(maxsize=None)
def routed_int8_kernel(shape: RoutedShape):
    n_local, rows, hidden, inter = shape.n_local, shape.rows, shape.ffn.hidden, shape.ffn.inter
    dt = PL_DTYPES[shape.ffn.dtype]
    routed_experts_int8 = routed_int8(shape)

    @pl.jit
    def moe_experts_int8(
        recv_x: pl.Tensor[[n_local, rows, hidden], dt],
        counts: pl.Tensor[[n_local], pl.INT32],
        w_gate: pl.Tensor[[n_local, inter, hidden], pl.INT8],
        gate_scale: pl.Tensor[[n_local, inter], pl.FP32],
        w_up: pl.Tensor[[n_local, inter, hidden], pl.INT8],
        up_scale: pl.Tensor[[n_local, inter], pl.FP32],
        w_down: pl.Tensor[[n_local, hidden, inter], pl.INT8],
        down_scale: pl.Tensor[[n_local, hidden], pl.FP32],
        y: pl.Out[pl.Tensor[[n_local, rows, hidden], dt]],
    ):
        routed_experts_int8(recv_x, counts, w_gate, gate_scale, w_up, up_scale, w_down, down_scale, y)
        return y

    return moe_experts_int8


@functools.lru_cache(maxsize=None)
def shared_bf16_kernel(shape: FfnShape):
    hidden, inter, dt = shape.hidden, shape.inter, PL_DTYPES[shape.dtype]
    ffn, to_out = bf16_ffn(shape), cast_to(pl.FP32, dt)

    @pl.jit
    def moe_shared_expert(
        x: pl.Tensor[[T_DYN, hidden], dt],
        w_gate: pl.Tensor[[1, inter, hidden], dt],
        w_up: pl.Tensor[[1, inter, hidden], dt],
        w_down: pl.Tensor[[1, hidden, inter], dt],
        y: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        x.bind_dynamic(0, T_DYN)
        y.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="moe_shared_expert"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            x_tile = pl.fillpad(pl.set_validshape(x[t0 : t0 + ROW_TILE, :], valid, hidden))
            y_tile = ffn(x_tile, w_gate[0, :, :], w_up[0, :, :], w_down[0, :, :])
            y[t0 : t0 + ROW_TILE, :] = pl.set_validshape(to_out(y_tile), valid, hidden)
        return y

    return moe_shared_expert


@functools.lru_cache(maxsize=None)
def shared_int8_kernel(shape: FfnShape):
    hidden, inter, dt = shape.hidden, shape.inter, PL_DTYPES[shape.dtype]
    ffn, to_out = int8_ffn(shape), cast_to(pl.FP32, dt)

    @pl.jit
    def moe_shared_expert_int8(
        x: pl.Tensor[[T_DYN, hidden], dt],
        w_gate: pl.Tensor[[1, inter, hidden], pl.INT8],
        gate_scale: pl.Tensor[[1, inter], pl.FP32],
        w_up: pl.Tensor[[1, inter, hidden], pl.INT8],
        up_scale: pl.Tensor[[1, inter], pl.FP32],
        w_down: pl.Tensor[[1, hidden, inter], pl.INT8],
        down_scale: pl.Tensor[[1, hidden], pl.FP32],
        y: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        x.bind_dynamic(0, T_DYN)
        y.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="moe_shared_expert_int8"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            x_tile = pl.fillpad(pl.set_validshape(x[t0 : t0 + ROW_TILE, :], valid, hidden))
            y_tile = ffn(x_tile, w_gate[0, :, :], gate_scale, w_up[0, :, :], up_scale, w_down[0, :, :], down_scale)
            y[t0 : t0 + ROW_TILE, :] = pl.set_validshape(to_out(y_tile), valid, hidden)
        return y

    return moe_shared_expert_int8


def _weight_args(weights) -> tuple:
    if weights.quantized:
        return (weights.w_gate, weights.gate_scale, weights.w_up, weights.up_scale, weights.w_down,
                weights.down_scale)
    return weights.w_gate, weights.w_up, weights.w_down


def _ffn_shape(cfg: MoEConfig, weights) -> FfnShape:
    return FfnShape(cfg.hidden, weights.inter, cfg.dtype, weights.quantized, cfg.swiglu_limit, ffn_module.K_TILE_MAX)


def run_experts(cfg: MoEConfig, weights, recv_x: torch.Tensor, counts: torch.Tensor,
                out: torch.Tensor | None = None, *, rows_hint: int | None = None) -> torch.Tensor:
    """The routed experts of this rank on the dispatch layout: recv_x [E_local, R, H] in cfg.dtype
    (R = world * max_tokens_per_rank, world = num_experts // E_local), counts [E_local] int32 (read by the kernel,
    never by the host). Returns y like recv_x, written in `out` when given: y[e, :counts[e]] is expert e's FFN of
    those rows; rows past counts[e] are zeros, or keep out's contents past the last live row tile.
    `rows_hint`: the rows an expert is expected to get at most (e.g. world * T at decode); up to DECODE_ROWS_MAX it
    selects a decode form, whose replays hold for any counts within the hint (counts past it stay correct): when
    the hint's routes reach at most half the local experts, only the experts with rows run (their y rows written
    as above; an expert with no rows keeps out's contents), else every expert in one batched block."""
    _check_weights("run_experts", cfg, weights)
    recv_x, counts = _checked_dispatch_layout(cfg, weights, recv_x, counts)
    y = _checked_out("run_experts", recv_x, out)
    n_local, rows = recv_x.shape[:2]
    fixed = decode_rows(rows_hint, rows)
    shape = RoutedShape(_ffn_shape(cfg, weights), n_local, rows, EXPERT_SPLIT, fixed,
                        hit_slots(n_local, rows_hint, cfg.top_k) if fixed else 0)
    if shape.slots:
        order = torch.empty(1, SORT_WIDTH, dtype=torch.int32)
        expert_slots_kernel(n_local)(counts, order)
        routed_slots_kernel(shape, weights.quantized)(recv_x, counts, order, *_weight_args(weights), y)
        return y
    kernel = routed_int8_kernel(shape) if weights.quantized else routed_bf16_kernel(shape)
    kernel(recv_x, counts, *_weight_args(weights), y)
    return y


def hit_slots(n_local: int, rows_hint: int, top_k: int) -> int:
    """The hit-experts form's slots: the most local experts rows_hint rows of top_k routes each can reach, when
    that is at most half of them (reading only those experts' weights then beats the batched form reading all of
    them: at batch 1 of 8 experts, 2 cold expert reads cost ~1/7 of the 8), else 0: the batched form."""
    reach = max(1, rows_hint) * top_k
    return reach if 2 * reach <= n_local <= SORT_WIDTH else 0


def decode_rows(rows_hint: int | None, rows: int) -> int:
    """The decode form's fixed rows for a hint (the hint itself, at least 1, at most rows: the FFN's matmuls cost
    what their rows do, so no rounding up to a tile), or 0: the tile-loop form."""
    if rows_hint is None or rows_hint > DECODE_ROWS_MAX:
        return 0
    return min(rows, max(1, rows_hint))


def shared_expert(cfg: MoEConfig, weights, x: torch.Tensor) -> torch.Tensor:
    """The shared expert (weights stacking one expert) on this rank's tokens x [T, H] in cfg.dtype: y [T, H].
    T may be 0 (no kernel runs)."""
    _check_weights("shared_expert", cfg, weights, shared=True)
    bad = MoEArgumentError.at_caller
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != cfg.hidden:
        raise bad(f"shared_expert: x must be a [T, {cfg.hidden}] tensor (hidden={cfg.hidden}), got {describe(x)}")
    if x.dtype != cfg.dtype:
        raise bad(f"shared_expert: x is {x.dtype}, but the config's dtype is {cfg.dtype}", hint="cast x first")
    y = torch.zeros_like(x, memory_format=torch.contiguous_format)
    if x.shape[0]:
        shape = _ffn_shape(cfg, weights)
        kernel = shared_int8_kernel(shape) if weights.quantized else shared_bf16_kernel(shape)
        kernel(x.contiguous(), *_weight_args(weights), y)
    return y


def _check_weights(where: str, cfg: MoEConfig, weights, shared: bool = False) -> None:
    bad = MoEArgumentError.at_caller
    if not isinstance(weights, (ExpertWeights, QuantizedExpertWeights)):
        raise bad(f"{where}: weights must be ExpertWeights or QuantizedExpertWeights, got {describe(weights)}",
                  hint="load them with load_moe_weights, or build ExpertWeights(w_gate, w_up, w_down)")
    if weights.hidden != cfg.hidden:
        raise bad(f"{where}: the weights' hidden size is {weights.hidden}, the config's hidden={cfg.hidden}")
    if shared and weights.experts != 1:
        raise bad(f"{where}: weights must stack exactly one expert, got {weights.experts}")
    if not shared and cfg.intermediate_size is not None and weights.inter != cfg.intermediate_size:
        raise bad(f"{where}: the weights' intermediate size is {weights.inter}, the config's "
                  f"intermediate_size={cfg.intermediate_size}")
    if not weights.quantized and weights.w_gate.dtype != cfg.dtype:
        raise bad(f"{where}: the weights are {weights.w_gate.dtype}, but the config's dtype is {cfg.dtype}",
                  hint="convert them (load_moe_weights does), or quantize them")


def _checked_dispatch_layout(cfg: MoEConfig, weights, recv_x, counts):
    """(recv_x, counts [E_local] int32), both contiguous; an error naming the argument otherwise."""
    bad = MoEArgumentError.at_caller
    n_local = weights.experts
    if cfg.num_experts % n_local:
        raise bad(f"run_experts: the weights hold {n_local} experts, which does not divide "
                  f"num_experts={cfg.num_experts}", hint="each rank holds num_experts // world experts")
    rows = cfg.num_experts // n_local * cfg.max_tokens_per_rank
    want = [n_local, rows, cfg.hidden]
    if not isinstance(recv_x, torch.Tensor) or list(recv_x.shape) != want:
        raise bad(f"run_experts: recv_x must be {want} ([local experts, world * max_tokens_per_rank, hidden]), "
                  f"got {describe(recv_x)}")
    if recv_x.dtype != cfg.dtype:
        raise bad(f"run_experts: recv_x is {recv_x.dtype}, but the config's dtype is {cfg.dtype}")
    if not isinstance(counts, torch.Tensor) or counts.dtype != torch.int32 or counts.numel() != n_local:
        raise bad(f"run_experts: counts must be an int32 tensor of {n_local} elements (one per local expert), "
                  f"got {describe(counts)}")
    return recv_x.contiguous(), counts.contiguous().view(n_local)


def _checked_out(where: str, like: torch.Tensor, out):
    if out is None:
        return torch.zeros_like(like)
    if not isinstance(out, torch.Tensor) or out.shape != like.shape or out.dtype != like.dtype \
            or not out.is_contiguous():
        raise MoEArgumentError.at_caller(
            f"{where}: out must be a contiguous {like.dtype} tensor of shape {list(like.shape)}, "
            f"got {describe(out)}")
    return out

