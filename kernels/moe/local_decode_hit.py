"""The one-rank MoE decode layer for one token: only its K hit experts' weights are read.

    route: logits = x @ router.T -> gate -> (topk_idx, topk_weights)            kernel 1 (its outputs are data)
    e_k = topk_idx[0, k] read with pl.read; each expert's gate | up columns (side by side) and down rows are
    slices of the fused layout (no copy):                                       kernel 2, one block
        [g_k u_k] = x @ [W_gate[e_k] W_up[e_k]], the same for shared            one small GEMM per expert
        h = swiglu(g, u) rounded; h_k *= w_k, rounded
        out = round(sum_k h_k @ W_down[e_k] + h_shared @ W_down_shared)          FP32 accumulation

Two kernels, not one: an expert id read from data the same call computed would be fixed in a replay; read from
an input it stays data, so calls with new routing replay (as experts_decode's hit-experts form). The dense
one-kernel form (local_decode.py) reads every expert's weights: at 8 experts top-2 that is 4x the bytes. The
rounding points are the dense form's (h, w * h, the sum once).
"""
import functools
from typing import NamedTuple

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.out_norm import out_proj_add_normer
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe.ffn import PL_DTYPES, cast_to, k_tile, projection, swiglu_of
from pypto_rt.kernels.moe.gate import route_tile
from pypto_rt.kernels.moe.local_decode import LocalDecodeShape, swiglu_blocks


class HitForm(NamedTuple):
    """A layer's weights in the one-token form (MoELayer.one_token_form), as fused kernels take them."""
    gate_up: torch.Tensor         # [H, 2 N], LocalDecodeWeights' layout
    down: torch.Tensor            # [N, H]
    router: torch.Tensor          # [E, H], contiguous
    bias: torch.Tensor            # [1, E] FP32 (zeros without a selection bias)
    shape: LocalDecodeShape


def uses_hit_experts(shape: LocalDecodeShape, tokens: int) -> bool:
    """One token whose K routes are fewer than the experts (the dense form computes E / K times the FLOPs)."""
    return tokens == 1 and shape.gate.top_k < shape.gate.num_experts


def router_and_gate(shape: LocalDecodeShape, tokens: int):
    """The inline `(x [tokens, H], gate_weight [E, H], bias [1, E] FP32) -> (topk_idx, topk_weights)`: the router
    GEMM in FP32, then the gate of the live rows (no padded rows to route)."""
    hidden, dt, rdt = shape.hidden, PL_DTYPES[shape.dtype], PL_DTYPES[shape.router_dtype]
    mixed = dt != rdt
    router = projection(hidden, k_tile(hidden, ffn_module.K_TILE_MAX), pl.FP32,
                        cast_to(dt, pl.FP32) if mixed else None, cast_to(rdt, pl.FP32) if mixed else None)
    route = route_tile(shape.gate, rows=tokens)

    @pl.jit.inline
    def router_route(x, gate_weight, bias):
        return route(router(x, gate_weight), bias)

    return router_route


@functools.lru_cache(maxsize=None)
def local_route_kernel(shape: LocalDecodeShape, tokens: int):
    """`(x [T, H], gate_weight [E, H], bias [1, E] FP32, topk_idx [T, K] INT32 out, topk_weights [T, K] FP32 out)`."""
    experts, top_k, hidden = shape.gate.num_experts, shape.gate.top_k, shape.hidden
    dt, rdt = PL_DTYPES[shape.dtype], PL_DTYPES[shape.router_dtype]
    router_route = router_and_gate(shape, tokens)

    @pl.jit
    def moe_local_route(
        x: pl.Tensor[[tokens, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        topk_idx: pl.Out[pl.Tensor[[tokens, top_k], pl.INT32]],
        topk_weights: pl.Out[pl.Tensor[[tokens, top_k], pl.FP32]],
    ):
        for _ in pl.spmd(1, name_hint="moe_local_route"):
            chosen, weights = router_route(x[0:tokens, :], gate_weight, bias)
            topk_idx[:, :] = chosen
            topk_weights[:, :] = weights
        return topk_idx, topk_weights

    return moe_local_route


@functools.lru_cache(maxsize=None)
def out_proj_norm_route_kernel(shape: LocalDecodeShape, k_in: int, eps: float):
    """`(attn [1, k_in], w_o [H, k_in], residual [1, H] in/out, norm_weight [1, H], gate_weight [E, H], bias [1, E]
    FP32, normed [1, H] out, topk_idx [1, K] INT32 out, topk_weights [1, K] FP32 out)`: the attention block's
    O projection, residual add and RMSNorm (kernels.layers.out_norm) and then the route of the normed token, one
    kernel: what out_proj_add_norm then local_route_kernel compute, the same roundings, one call fewer."""
    experts, top_k, hidden = shape.gate.num_experts, shape.gate.top_k, shape.hidden
    dt, rdt = PL_DTYPES[shape.dtype], PL_DTYPES[shape.router_dtype]
    add_norm, router_route = out_proj_add_normer(hidden, k_in, dt, eps), router_and_gate(shape, 1)

    @pl.jit
    def out_proj_norm_route(
        attn: pl.Tensor[[1, k_in], dt],
        w_o: pl.Tensor[[hidden, k_in], dt],
        residual: pl.InOut[pl.Tensor[[1, hidden], dt]],
        norm_weight: pl.Tensor[[1, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        normed: pl.Out[pl.Tensor[[1, hidden], dt]],
        topk_idx: pl.Out[pl.Tensor[[1, top_k], pl.INT32]],
        topk_weights: pl.Out[pl.Tensor[[1, top_k], pl.FP32]],
    ):
        for _ in pl.spmd(1, name_hint="out_proj_norm_route"):
            summed, x = add_norm(attn, w_o, residual, norm_weight)
            residual[:, :] = summed
            normed[:, :] = x
            chosen, weights = router_route(x, gate_weight, bias)
            topk_idx[:, :] = chosen
            topk_weights[:, :] = weights
        return normed, residual, topk_idx, topk_weights

    return out_proj_norm_route


def hit_experter(shape: LocalDecodeShape):
    """The inline `(x [1, H], topk_idx [1, K] INT32, topk_weights [1, K] FP32, gate_up, down) -> out [1, H]` in the
    dtype: one token's K routed experts (their ids read from topk_idx, an input: a replay reads them again) and
    the shared expert. Kernels that fuse what follows the layer (kernels.decoder) call it too."""
    top_k, inter, shared_inter = shape.gate.top_k, shape.inter, shape.shared_inter
    routed_cols = shape.gate.num_experts * inter
    width, dt = routed_cols + shared_inter, PL_DTYPES[shape.dtype]
    swiglu, narrow, widen = swiglu_of(shape.swiglu_limit), cast_to(pl.FP32, dt), cast_to(dt, pl.FP32)
    gated = swiglu_blocks(top_k, inter, shared_inter, swiglu, narrow)
    # each expert block as (its first down row, width): its gate | up columns start at twice the row. The shared
    # expert's block is fixed
    fixed = [(routed_cols, shared_inter)] if shared_inter else []

    @pl.jit.inline
    def hit_experts(x, topk_idx, topk_weights, gate_up, down):
        blocks = []
        for k in range(top_k):       # the expert's first down row, read from data
            blocks.append((pl.read(topk_idx, [0, k]) * inter, inter))
        blocks += fixed
        gu = None
        for row, cols in blocks:     # each block's gate | up: one GEMM over its contiguous columns
            gu_b = pl.matmul(x, gate_up[:, 2 * row : 2 * (row + cols)], out_dtype=pl.FP32)
            gu = gu_b if gu is None else pl.concat(gu, gu_b)
        h = gated(gu, 1)                             # [1, K * I + I_shared]: one pass for every block
        routes = pl.reshape(widen(h[:, 0 : top_k * inter]), [top_k, inter])
        weighted = narrow(pl.mul(routes, pl.reshape(topk_weights[0:1, :], [top_k, 1])))
        acc = pl.matmul(weighted[0:1, :], down[blocks[0][0] : blocks[0][0] + inter, :], out_dtype=pl.FP32)
        for k in range(1, top_k):
            acc = pl.matmul_acc(acc, weighted[k : k + 1, :], down[blocks[k][0] : blocks[k][0] + inter, :])
        if shared_inter:
            acc = pl.matmul_acc(acc, h[:, top_k * inter : top_k * inter + shared_inter], down[routed_cols:width, :])
        return narrow(acc)

    return hit_experts


@functools.lru_cache(maxsize=None)
def local_hit_kernel(shape: LocalDecodeShape):
    """`(x [1, H], topk_idx [1, K] INT32, topk_weights [1, K] FP32, gate_up, down, out [1, H] out)`: the routed
    and shared experts of `local_route_kernel`'s routing for one token."""
    top_k, hidden = shape.gate.top_k, shape.hidden
    width, dt = shape.gate.num_experts * shape.inter + shape.shared_inter, PL_DTYPES[shape.dtype]
    hit_experts = hit_experter(shape)

    @pl.jit
    def moe_local_hit(
        x: pl.Tensor[[1, hidden], dt],
        topk_idx: pl.Tensor[[1, top_k], pl.INT32],
        topk_weights: pl.Tensor[[1, top_k], pl.FP32],
        gate_up: pl.Tensor[[hidden, 2 * width], dt],
        down: pl.Tensor[[width, hidden], dt],
        out: pl.Out[pl.Tensor[[1, hidden], dt]],
    ):
        for _ in pl.spmd(1, name_hint="moe_local_hit"):
            out[:, :] = hit_experts(x, topk_idx, topk_weights, gate_up, down)
        return out

    return moe_local_hit
