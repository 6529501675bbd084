"""One expert's SwiGLU FFN on one tile of ROW_TILE token rows, as `@pl.jit.inline` bodies built per FfnShape:

    bf16  y = (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T            FP32 accumulation, h in the model dtype
    int8  per row: x_scale = amax(|x|) / 127, xq = int8(x / x_scale)     (W8A8)
          g = (xq @ wq_gate.T) [INT32] * x_scale * gate_scale, u likewise; h = silu(g) * u
          per row: h_scale = amax(|h|) / 127, hq = int8(h / h_scale); y = (hq @ wq_down.T) * h_scale * down_scale

With swiglu_limit set, both clamp the SwiGLU inputs first: gate <= limit, -limit <= up <= limit. Weights use the
Hugging Face layout (w_gate, w_up [I, H]; w_down [H, I]; int8 scales per output channel, [1, I] and [1, H]). The
contractions walk H and I in k_tile steps (matmul, then matmul_acc). Rows are independent: the callers zero the
tile's rows past the live ones, and a zero row yields a zero row (its int8 scale is AMAX_EPS / 127).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.tile_casts import PL_DTYPES, cast_to, identity

ROW_TILE = 16                # token rows per tile
K_TILE_MAX = 512             # the longest contraction step; a dimension is walked in its largest divisor up to this
AMAX_EPS = 1e-6              # the smallest row amax an int8 scale is taken from (a zero row quantises to zeros)
INT8_MAX = 127.0
INV_INT8_MAX = 1.0 / INT8_MAX


def k_tile(extent: int, most: int) -> int:
    """The contraction step for a dimension of `extent`: its largest divisor up to `most` that is a multiple of 16,
    or the whole extent when none is."""
    return next((k for k in range(min(most, extent) // 16 * 16, 0, -16) if extent % k == 0), extent)


@dataclass(frozen=True)
class FfnShape:
    """What a compiled FFN body depends on."""
    hidden: int
    inter: int
    dtype: torch.dtype            # activations in and out, and the bf16 path's weights and h
    quantized: bool
    swiglu_limit: float | None
    k_most: int                   # the longest contraction step (K_TILE_MAX)

    @property
    def hidden_step(self) -> int:
        return k_tile(self.hidden, self.k_most)

    @property
    def inter_step(self) -> int:
        return k_tile(self.inter, self.k_most)


@pl.jit.inline
def _silu_mul(gate, up):
    return pl.mul(pl.mul(gate, pl.recip(pl.add(pl.exp(pl.neg(gate)), 1.0))), up)


def swiglu_of(limit: float | None):
    """An inline `(gate, up) FP32 -> silu(gate) * up`, clamping the inputs when `limit` is set."""
    if limit is None:
        return _silu_mul
    bound = float(limit)

    @pl.jit.inline
    def clamped_silu_mul(gate, up):
        return _silu_mul(pl.minimum(gate, bound), pl.maximum(pl.minimum(up, bound), -bound))

    return clamped_silu_mul


def projection(contracted: int, step: int, acc_dtype, convert_a=None, convert_b=None):
    """An inline `(a [R, K], w [N, K]) -> a @ w.T` in `acc_dtype`, walking K (= `contracted`) in `step`s; each
    K slice of a and of w passes through `convert_a` / `convert_b` (inlines, e.g. `cast_to`) when given."""
    lhs, rhs = convert_a or identity, convert_b or identity

    @pl.jit.inline
    def project(a, w):
        acc = pl.matmul(lhs(a[:, 0:step]), rhs(w[:, 0:step]), b_trans=True, out_dtype=acc_dtype)
        for k0 in pl.pipeline(step, contracted, step, stage=2):
            acc = pl.matmul_acc(acc, lhs(a[:, k0 : k0 + step]), rhs(w[:, k0 : k0 + step]), b_trans=True)
        return acc

    return project


# the per-row symmetric int8 scale [R, 1] of FP32 rows: max(amax, AMAX_EPS) / 127
@pl.jit.inline
def _row_scale(rows):
    return pl.mul(pl.maximum(pl.row_max(pl.abs(rows)), AMAX_EPS), INV_INT8_MAX)


# FP32 rows times their row scale's reciprocal, rounded half to even, as INT8 (the rint / FP16 / trunc chain)
@pl.jit.inline
def _quantize(rows, scale):
    q32 = pl.cast(pl.row_expand_mul(rows, pl.recip(scale)), target_type=pl.INT32, mode="rint")
    return pl.cast(pl.cast(q32, target_type=pl.FP16, mode="round"), target_type=pl.INT8, mode="trunc")


@pl.jit.inline
def _dequantize(acc, row_scale, channel_scale):
    return pl.col_expand_mul(pl.row_expand_mul(pl.cast(acc, target_type=pl.FP32, mode="none"), row_scale),
                             channel_scale)


def bf16_ffn(shape: FfnShape, project=None):
    """An inline `(x [ROW_TILE, H] dtype, w_gate [I, H], w_up [I, H], w_down [H, I]) -> y [ROW_TILE, H] FP32`;
    `project` (default `projection`) makes its matmuls, e.g. `batched_projection` for every expert at once."""
    project = project or projection
    from_hidden = project(shape.hidden, shape.hidden_step, pl.FP32)
    from_inter = project(shape.inter, shape.inter_step, pl.FP32)
    swiglu, to_dtype = swiglu_of(shape.swiglu_limit), cast_to(pl.FP32, PL_DTYPES[shape.dtype])

    @pl.jit.inline
    def ffn(x, w_gate, w_up, w_down):
        h = to_dtype(swiglu(from_hidden(x, w_gate), from_hidden(x, w_up)))
        return from_inter(h, w_down)

    return ffn


def int8_ffn(shape: FfnShape):
    """An inline `(x [ROW_TILE, H] dtype, wq_gate [I, H] INT8, gate_scale [1, I], wq_up, up_scale, wq_down [H, I],
    down_scale [1, H]) -> y [ROW_TILE, H] FP32` (W8A8 with per-row activation scales)."""
    from_hidden = projection(shape.hidden, shape.hidden_step, pl.INT32)
    from_inter = projection(shape.inter, shape.inter_step, pl.INT32)
    swiglu, to_fp32 = swiglu_of(shape.swiglu_limit), cast_to(PL_DTYPES[shape.dtype], pl.FP32)

    @pl.jit.inline
    def ffn(x, wq_gate, gate_scale, wq_up, up_scale, wq_down, down_scale):
        xf = to_fp32(x)
        x_scale = _row_scale(xf)
        xq = _quantize(xf, x_scale)
        gate = _dequantize(from_hidden(xq, wq_gate), x_scale, gate_scale)
        up = _dequantize(from_hidden(xq, wq_up), x_scale, up_scale)
        h = swiglu(gate, up)
        h_scale = _row_scale(h)
        return _dequantize(from_inter(_quantize(h, h_scale), wq_down), h_scale, down_scale)

    return ffn


# ---- batched forms: every local expert at once, x [E, R, H] against the stacked weights [E, N, K] ----

def batched_projection(contracted: int, step: int, acc_dtype):
    """An inline `(a [E, R, K], w [E, N, K]) -> a @ w.T per expert [E, R, N]` in `acc_dtype`, walking K in steps."""

    @pl.jit.inline
    def project(a, w):
        acc = pl.matmul(a[:, :, 0:step], w[:, :, 0:step], b_trans=True, out_dtype=acc_dtype)
        for k0 in pl.pipeline(step, contracted, step, stage=2):
            acc = pl.matmul_acc(acc, a[:, :, k0 : k0 + step], w[:, :, k0 : k0 + step], b_trans=True)
        return acc

    return project


def batched_bf16_ffn(shape: FfnShape):
    """bf16_ffn over every expert at once: `(x [E, R, H] dtype, w_gate [E, I, H], w_up, w_down [E, H, I]) ->
    y [E, R, H] FP32`, expert e's rows against expert e's weights (batched matmuls)."""
    return bf16_ffn(shape, batched_projection)


def batched_int8_ffn(shape: FfnShape, experts: int, rows: int):
    """int8_ffn over every expert at once: `(x [E, R, H] dtype, wq_gate [E, I, H] INT8, gate_scale [E, I], wq_up,
    up_scale, wq_down [E, H, I], down_scale [E, H]) -> y [E, R, H] FP32`. Row scales are taken on the [E * R, .]
    rows; each expert's channel scales broadcast over its rows as [E, 1, N]."""
    hidden, inter = shape.hidden, shape.inter
    from_hidden = batched_projection(hidden, shape.hidden_step, pl.INT32)
    from_inter = batched_projection(inter, shape.inter_step, pl.INT32)
    swiglu, to_fp32 = swiglu_of(shape.swiglu_limit), cast_to(PL_DTYPES[shape.dtype], pl.FP32)
    flat = experts * rows

    @pl.jit.inline
    def dequantize(acc, row_scale, channel_scale):
        return pl.mul(pl.mul(pl.cast(acc, target_type=pl.FP32, mode="none"), row_scale), channel_scale)

    @pl.jit.inline
    def ffn(x, wq_gate, gate_scale, wq_up, up_scale, wq_down, down_scale):
        xf = pl.reshape(to_fp32(x), [flat, hidden])
        x_scale = _row_scale(xf)
        xq = pl.reshape(_quantize(xf, x_scale), [experts, rows, hidden])
        x_scale3 = pl.reshape(x_scale, [experts, rows, 1])
        gate = dequantize(from_hidden(xq, wq_gate), x_scale3, pl.reshape(gate_scale, [experts, 1, inter]))
        up = dequantize(from_hidden(xq, wq_up), x_scale3, pl.reshape(up_scale, [experts, 1, inter]))
        h = pl.reshape(swiglu(gate, up), [flat, inter])
        h_scale = _row_scale(h)
        hq = pl.reshape(_quantize(h, h_scale), [experts, rows, inter])
        return dequantize(from_inter(hq, wq_down), pl.reshape(h_scale, [experts, rows, 1]),
                          pl.reshape(down_scale, [experts, 1, hidden]))

    return ffn
