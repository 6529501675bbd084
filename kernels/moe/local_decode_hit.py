"""The one-rank MoE decode layer for a few tokens (T * K < E): only the hit experts' weights are read.

    route: logits = x @ router.T -> gate -> (topk_idx, topk_weights)               kernel 1 (its outputs are data)
    slot s = (t, k), e = topk_idx[t, k] read with pl.read:                          kernel 2, one block per slot
        part[s] = (w[t, k] * swiglu(x_t @ W_gate[e], x_t @ W_up[e])) @ W_down[e]   (FP32, weights as column /
                                                                                     row slices of the fused layout)
    out = round(sum_k part[(t, k)] + shared(x))                                     kernel 2, a last block

Two kernels, not one: an expert id read from data the same call computed would be fixed in a replay; read from
an input it stays data, so calls with new routing replay (as experts_decode's hit-experts form). The dense
one-kernel form (local_decode.py) reads every expert's weights: at T = 1 with 8 experts top-2 that is 4x the
bytes. Same weights, same rounding points as the dense form (h rounded, w * h rounded, one rounding of the sum).
"""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe.ffn import PL_DTYPES, cast_to, k_tile, projection, swiglu_of
from pypto_rt.kernels.moe.gate import ROW_TILE, route_tile
from pypto_rt.kernels.moe.local_decode import LocalDecodeShape


def uses_hit_experts(shape: LocalDecodeShape, tokens: int) -> bool:
    """The hit-experts form pays off while the slots (T * K) are fewer than the experts."""
    return tokens * shape.gate.top_k < shape.gate.num_experts


@functools.lru_cache(maxsize=None)
def local_route_kernel(shape: LocalDecodeShape, tokens: int):
    """`(x [T, H], gate_weight [E, H], bias [1, E] FP32, topk_idx [T, K] INT32 out, topk_weights [T, K] FP32 out)`."""
    experts, top_k, hidden = shape.gate.num_experts, shape.gate.top_k, shape.hidden
    dt, rdt = PL_DTYPES[shape.dtype], PL_DTYPES[shape.router_dtype]
    mixed = dt != rdt
    router = projection(hidden, k_tile(hidden, ffn_module.K_TILE_MAX), pl.FP32,
                        cast_to(dt, pl.FP32) if mixed else None, cast_to(rdt, pl.FP32) if mixed else None)
    route = route_tile(shape.gate)

    @pl.jit
    def moe_local_route(
        x: pl.Tensor[[tokens, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        topk_idx: pl.Out[pl.Tensor[[tokens, top_k], pl.INT32]],
        topk_weights: pl.Out[pl.Tensor[[tokens, top_k], pl.FP32]],
    ):
        for _ in pl.spmd(1, name_hint="moe_local_route"):
            x_tile = pl.fillpad(pl.set_validshape(x[0:ROW_TILE, :], tokens, hidden))
            chosen, weights = route(router(x_tile, gate_weight), bias)
            topk_idx[:, :] = chosen[0:tokens, :]
            topk_weights[:, :] = weights[0:tokens, :]
        return topk_idx, topk_weights

    return moe_local_route


def _shared_part(shape: LocalDecodeShape, tokens: int):
    """An inline `(x, gate_up, down) -> [T, H] FP32`: the shared expert's output (zeros without one)."""
    routed_cols, width = shape.gate.num_experts * shape.inter, shape.gate.num_experts * shape.inter + shape.shared_inter
    dt = PL_DTYPES[shape.dtype]
    swiglu, narrow = swiglu_of(shape.swiglu_limit), cast_to(pl.FP32, dt)
    if not shape.shared_inter:
        @pl.jit.inline
        def no_shared(x, gate_up, down):
            return pl.full([tokens, shape.hidden], dtype=pl.FP32, value=0.0)
        return no_shared

    @pl.jit.inline
    def shared(x, gate_up, down):
        g = pl.matmul(x, gate_up[:, routed_cols:width], out_dtype=pl.FP32)
        u = pl.matmul(x, gate_up[:, width + routed_cols : 2 * width], out_dtype=pl.FP32)
        return pl.matmul(narrow(swiglu(g, u)), down[routed_cols:width, :], out_dtype=pl.FP32)

    return shared


@functools.lru_cache(maxsize=None)
def local_hit_kernel(shape: LocalDecodeShape, tokens: int):
    """`(x [T, H], topk_idx [T, K] INT32, topk_weights [T, K] FP32, gate_up, down, parts [T * K, H] FP32 out,
    out [T, H] out)`: the routed and shared experts of `local_route_kernel`'s routing."""
    top_k, hidden, inter = shape.gate.top_k, shape.hidden, shape.inter
    experts, width = shape.gate.num_experts, shape.gate.num_experts * shape.inter + shape.shared_inter
    slots, dt = tokens * top_k, PL_DTYPES[shape.dtype]
    swiglu, narrow, widen = swiglu_of(shape.swiglu_limit), cast_to(pl.FP32, dt), cast_to(dt, pl.FP32)
    shared = _shared_part(shape, tokens)

    @pl.jit
    def moe_local_hit(
        x: pl.Tensor[[tokens, hidden], dt],
        topk_idx: pl.Tensor[[tokens, top_k], pl.INT32],
        topk_weights: pl.Tensor[[tokens, top_k], pl.FP32],
        gate_up: pl.Tensor[[hidden, 2 * width], dt],
        down: pl.Tensor[[width, hidden], dt],
        parts: pl.Out[pl.Tensor[[slots, hidden], pl.FP32]],
        out: pl.Out[pl.Tensor[[tokens, hidden], dt]],
    ):
        for s in pl.spmd(slots, name_hint="moe_local_hit_slots"):
            t = s // top_k
            k = s - t * top_k
            c0 = pl.read(topk_idx, [t, k]) * inter          # the expert's first column / row: data
            x_t = x[t : t + 1, :]
            g = pl.matmul(x_t, gate_up[:, c0 : c0 + inter], out_dtype=pl.FP32)
            u = pl.matmul(x_t, gate_up[:, width + c0 : width + c0 + inter], out_dtype=pl.FP32)
            h = widen(narrow(swiglu(g, u)))
            weighted = narrow(pl.mul(h, topk_weights[t : t + 1, k : k + 1]))
            parts[s : s + 1, :] = pl.matmul(weighted, down[c0 : c0 + inter, :], out_dtype=pl.FP32)
        for _ in pl.spmd(1, name_hint="moe_local_hit_sum"):
            by_route = pl.reshape(pl.transpose(pl.reshape(parts[0:slots, :], [tokens, top_k, hidden]), 1, 2),
                                  [tokens * hidden, top_k])
            routed = pl.reshape(pl.row_sum(by_route), [tokens, hidden])
            out[:, :] = narrow(pl.add(routed, shared(x, gate_up, down)))
        return out

    return moe_local_hit
