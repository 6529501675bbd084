"""The routed experts' decode form (RoutedShape.fixed_rows > 0: the caller bounds every count by about fixed_rows,
e.g. world * T at decode): every local expert's first fixed_rows rows in one block of batched tile ops (the
matmuls batched over experts, [E_local, fixed_rows, H] against the stacked weights), rows past each count zeroed
by a compare and select, so the block's course and its torch calls follow neither the counts nor the number of
experts, and a call with new routing still replays. Rows past the bound, should a count exceed it, are served per
expert by ROW_TILE tiles from row fixed_rows on (a loop a replay guards on: such a call runs on the engine); y's
rows past a count are zeros up to the last computed row and keep out's contents after it.
"""
import functools

import pypto.language as pl
from pypto_rt.kernels.moe.ffn import (
    PL_DTYPES, ROW_TILE, batched_bf16_ffn, batched_int8_ffn, bf16_ffn, cast_to, int8_ffn,
)
from pypto_rt.kernels.moe.routed_shape import RoutedShape, live_expert_rows, live_rows


def routed_bf16_decode(shape: RoutedShape):
    """The decode form of experts.routed_bf16: the inline `(recv_x, counts, w_gate, w_up, w_down, y) -> y`."""
    n_local, rows, hidden, fixed = shape.n_local, shape.rows, shape.ffn.hidden, shape.fixed_rows
    dt = PL_DTYPES[shape.ffn.dtype]
    batched, ffn, to_out = batched_bf16_ffn(shape.ffn), bf16_ffn(shape.ffn), cast_to(pl.FP32, dt)
    live_tile, live_fixed = live_rows(hidden, dt), live_expert_rows(n_local, fixed, hidden, dt)

    @pl.jit.inline
    def routed_experts_decode(recv_x, counts, w_gate, w_up, w_down, y):
        for _ in pl.spmd(1, name_hint="moe_experts_decode"):
            x = live_fixed(recv_x[0:n_local, 0:fixed, :], counts)
            y[0:n_local, 0:fixed, :] = to_out(batched(x, w_gate[0:n_local, :, :], w_up[0:n_local, :, :],
                                                      w_down[0:n_local, :, :]))
        for e in pl.spmd(n_local, name_hint="moe_experts_overflow"):
            live = pl.min(pl.read(counts, [e]), rows)
            for tb in pl.range((pl.max(0, live - fixed) + ROW_TILE - 1) // ROW_TILE):
                t0 = fixed + tb * ROW_TILE
                x_tile = live_tile(recv_x[e, t0 : t0 + ROW_TILE, :], live - t0)
                y_tile = to_out(ffn(x_tile, w_gate[e, :, :], w_up[e, :, :], w_down[e, :, :]))
                y[e, t0 : t0 + ROW_TILE, :] = pl.set_validshape(y_tile, pl.min(ROW_TILE, rows - t0), hidden)
        return y

    return routed_experts_decode


def routed_int8_decode(shape: RoutedShape):
    """The decode form of experts.routed_int8 (W8A8): the inline `(recv_x, counts, w_gate, gate_scale, w_up,
    up_scale, w_down, down_scale, y) -> y`."""
    n_local, rows, hidden, fixed = shape.n_local, shape.rows, shape.ffn.hidden, shape.fixed_rows
    dt = PL_DTYPES[shape.ffn.dtype]
    batched, ffn = batched_int8_ffn(shape.ffn, n_local, fixed), int8_ffn(shape.ffn)
    to_out = cast_to(pl.FP32, dt)
    live_tile, live_fixed = live_rows(hidden, dt), live_expert_rows(n_local, fixed, hidden, dt)

    @pl.jit.inline
    def routed_experts_int8_decode(recv_x, counts, w_gate, gate_scale, w_up, up_scale, w_down, down_scale, y):
        for _ in pl.spmd(1, name_hint="moe_experts_int8_decode"):
            x = live_fixed(recv_x[0:n_local, 0:fixed, :], counts)
            y_fixed = batched(x, w_gate[0:n_local, :, :], gate_scale[0:n_local, :], w_up[0:n_local, :, :],
                              up_scale[0:n_local, :], w_down[0:n_local, :, :], down_scale[0:n_local, :])
            y[0:n_local, 0:fixed, :] = to_out(y_fixed)
        for e in pl.spmd(n_local, name_hint="moe_experts_int8_overflow"):
            live = pl.min(pl.read(counts, [e]), rows)
            for tb in pl.range((pl.max(0, live - fixed) + ROW_TILE - 1) // ROW_TILE):
                t0 = fixed + tb * ROW_TILE
                x_tile = live_tile(recv_x[e, t0 : t0 + ROW_TILE, :], live - t0)
                y_tile = ffn(x_tile, w_gate[e, :, :], gate_scale[e : e + 1, :], w_up[e, :, :],
                             up_scale[e : e + 1, :], w_down[e, :, :], down_scale[e : e + 1, :])
                y[e, t0 : t0 + ROW_TILE, :] = pl.set_validshape(to_out(y_tile), pl.min(ROW_TILE, rows - t0), hidden)
        return y

    return routed_experts_int8_decode


# ---- the hit-experts form (RoutedShape.slots > 0): only the experts with rows are run ----

SORT_WIDTH = 32             # expert_slots sorts the counts in one sort32 row: at most 32 local experts


@functools.lru_cache(maxsize=None)
def expert_slots_kernel(n_local: int):
    """`(counts [E_local] INT32, order [1, SORT_WIDTH] INT32 out)`: the local experts by falling count (ties: lower
    id first), so the experts with rows come first. A kernel of its own: the routed kernel reads `order` as an
    input, and offsets read from inputs stay data in a replay (from data computed in the same call they would not)."""

    @pl.jit
    def moe_expert_slots(counts: pl.Tensor[[n_local], pl.INT32], order: pl.Out[pl.Tensor[[1, SORT_WIDTH], pl.INT32]]):
        for _ in pl.spmd(1, name_hint="moe_expert_slots"):
            rows = pl.cast(pl.reshape(counts[0:n_local], [1, n_local]), target_type=pl.FP32, mode="none")
            padded = pl.fillpad_expand(rows, [1, SORT_WIDTH], pad_value=pl.PadValue.min)
            pairs = pl.sort32(padded, pl.arange(0, [1, SORT_WIDTH], dtype=pl.UINT32))
            order[0:1, :] = pl.gather(pairs, mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
        return order

    return moe_expert_slots


def _slot_ffn_blocks(shape: RoutedShape, quantized: bool):
    """The inline `(recv_x, counts, order, *weights, y) -> y` of the hit-experts form. Block p < slots serves the
    p-th expert of `order` (read from data: a replay reads it again) on its first fixed_rows rows, then ROW_TILE
    tiles past them; block p >= slots serves the p-th expert by ROW_TILE tiles from row 0, none while its count is 0
    (when at most `slots` experts have rows, the caller's bound). Experts with no rows are not run: their y rows
    keep out's contents."""
    n_local, rows, hidden, fixed, slots = shape.n_local, shape.rows, shape.ffn.hidden, shape.fixed_rows, shape.slots
    dt = PL_DTYPES[shape.ffn.dtype]
    ffn, to_out = (int8_ffn if quantized else bf16_ffn)(shape.ffn), cast_to(pl.FP32, dt)
    live_tile, live_fixed = live_rows(hidden, dt), live_rows(hidden, dt, fixed)

    inter = shape.ffn.inter

    # expert e's weights as [e : e + 1] slices reshaped: an integer index would clamp the window to the tensor's
    # end, a course a replay guards on (the last expert would take another), a slice inside it does not
    @pl.jit.inline
    def weights_of(w, e, n_out, n_in):
        return pl.reshape(w[e : e + 1, :, :], [n_out, n_in])

    if quantized:
        @pl.jit.inline
        def expert_ffn(x, e, w_gate, gate_scale, w_up, up_scale, w_down, down_scale):
            return to_out(ffn(x, weights_of(w_gate, e, inter, hidden), gate_scale[e : e + 1, :],
                              weights_of(w_up, e, inter, hidden), up_scale[e : e + 1, :],
                              weights_of(w_down, e, hidden, inter), down_scale[e : e + 1, :]))
    else:       # no scales: the entry passes the weights again in their places
        @pl.jit.inline
        def expert_ffn(x, e, w_gate, gate_scale, w_up, up_scale, w_down, down_scale):
            return to_out(ffn(x, weights_of(w_gate, e, inter, hidden), weights_of(w_up, e, inter, hidden),
                              weights_of(w_down, e, hidden, inter)))

    @pl.jit.inline
    def routed_experts_slots(recv_x, counts, order, w_gate, gate_scale, w_up, up_scale, w_down, down_scale, y):
        for p in pl.spmd(slots, name_hint="moe_experts_slots"):
            e = pl.read(order, [0, p])
            live = pl.min(pl.read(counts, [e]), rows)
            x = live_fixed(pl.reshape(recv_x[e : e + 1, 0:fixed, :], [fixed, hidden]), live)
            y_rows = expert_ffn(x, e, w_gate, gate_scale, w_up, up_scale, w_down, down_scale)
            y[e : e + 1, 0:fixed, :] = pl.reshape(y_rows, [1, fixed, hidden])
            for tb in pl.range((pl.max(0, live - fixed) + ROW_TILE - 1) // ROW_TILE):
                t0 = fixed + tb * ROW_TILE
                x_tile = live_tile(recv_x[e, t0 : t0 + ROW_TILE, :], live - t0)
                y_tile = expert_ffn(x_tile, e, w_gate, gate_scale, w_up, up_scale, w_down, down_scale)
                y[e, t0 : t0 + ROW_TILE, :] = pl.set_validshape(y_tile, pl.min(ROW_TILE, rows - t0), hidden)
        for q in pl.spmd(n_local - slots, name_hint="moe_experts_past_slots"):
            e = pl.read(order, [0, slots + q])
            live = pl.min(pl.read(counts, [e]), rows)
            for tb in pl.range((live + ROW_TILE - 1) // ROW_TILE):
                t0 = tb * ROW_TILE
                x_tile = live_tile(recv_x[e, t0 : t0 + ROW_TILE, :], live - t0)
                y_tile = expert_ffn(x_tile, e, w_gate, gate_scale, w_up, up_scale, w_down, down_scale)
                y[e, t0 : t0 + ROW_TILE, :] = pl.set_validshape(y_tile, pl.min(ROW_TILE, rows - t0), hidden)
        return y

    return routed_experts_slots


@functools.lru_cache(maxsize=None)
def routed_slots_kernel(shape: RoutedShape, quantized: bool):
    """The `@pl.jit` entry of the hit-experts form: `(recv_x, counts, order, *weights, y)`, weights as
    experts.run_experts passes them (with scales when quantized)."""
    n_local, rows, hidden, inter = shape.n_local, shape.rows, shape.ffn.hidden, shape.ffn.inter
    dt = PL_DTYPES[shape.ffn.dtype]
    wdt = pl.INT8 if quantized else dt
    body = _slot_ffn_blocks(shape, quantized)

    if quantized:
        @pl.jit
        def moe_experts_slots_int8(
            recv_x: pl.Tensor[[n_local, rows, hidden], dt],
            counts: pl.Tensor[[n_local], pl.INT32],
            order: pl.Tensor[[1, SORT_WIDTH], pl.INT32],
            w_gate: pl.Tensor[[n_local, inter, hidden], wdt],
            gate_scale: pl.Tensor[[n_local, inter], pl.FP32],
            w_up: pl.Tensor[[n_local, inter, hidden], wdt],
            up_scale: pl.Tensor[[n_local, inter], pl.FP32],
            w_down: pl.Tensor[[n_local, hidden, inter], wdt],
            down_scale: pl.Tensor[[n_local, hidden], pl.FP32],
            y: pl.Out[pl.Tensor[[n_local, rows, hidden], dt]],
        ):
            body(recv_x, counts, order, w_gate, gate_scale, w_up, up_scale, w_down, down_scale, y)
            return y

        return moe_experts_slots_int8

    @pl.jit
    def moe_experts_slots(
        recv_x: pl.Tensor[[n_local, rows, hidden], dt],
        counts: pl.Tensor[[n_local], pl.INT32],
        order: pl.Tensor[[1, SORT_WIDTH], pl.INT32],
        w_gate: pl.Tensor[[n_local, inter, hidden], wdt],
        w_up: pl.Tensor[[n_local, inter, hidden], wdt],
        w_down: pl.Tensor[[n_local, hidden, inter], wdt],
        y: pl.Out[pl.Tensor[[n_local, rows, hidden], dt]],
    ):
        body(recv_x, counts, order, w_gate, w_gate, w_up, w_up, w_down, w_down, y)
        return y

    return moe_experts_slots
