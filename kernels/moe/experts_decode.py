"""The routed experts' decode form (RoutedShape.fixed_rows > 0: the caller bounds every count by about fixed_rows,
e.g. world * T at decode): every local expert's first fixed_rows rows in one block of batched tile ops (the
matmuls batched over experts, [E_local, fixed_rows, H] against the stacked weights), rows past each count zeroed
by a compare and select, so the block's course and its torch calls follow neither the counts nor the number of
experts, and a call with new routing still replays. Rows past the bound, should a count exceed it, are served per
expert by ROW_TILE tiles from row fixed_rows on (a loop a replay guards on: such a call runs on the engine); y's
rows past a count are zeros up to the last computed row and keep out's contents after it.
"""
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
