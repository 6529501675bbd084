"""A whole MoE layer at decode size in one `@pl.jit` kernel, for a job of one rank (every expert is local: serving
engines run expert parallel 1 too), so nothing is dispatched or combined through a buffer:

    logits = x @ router.T (FP32) -> gate -> topk (idx, weights)            the gate's own inline (gate.route_tile)
    [g_0 u_0 | g_1 u_1 | ... | g_s u_s] = x @ gate_up                      one GEMM, FP32 accumulation
    h = swiglu(g, u) rounded to the dtype                                     [T, E * I + I_shared]
    h_e *= w[t, e] (0 off the token's top-k; the shared expert's columns by 1)
    out = h @ [W_down of every expert | shared].T, rounded once              one GEMM: the weighted sum over experts

Every expert runs on every token row (T <= DECODE_ROWS_MAX): the FLOPs of the routed decode form, which computes
each local expert on its fixed rows, without the staging, the counts read from data or the expert loop; its
torch calls follow neither the routing nor the expert count, so every call replays. The weights move inside the
down GEMM (sum_e w_e (h_e W_e) = sum_e (w_e h_e) W_e), so the routes are summed within its FP32 accumulation
rather than each expert's output rounded first: FP32 results differ from the golden's in the last bits, bf16 ones
by the rounding of w_e h_e. `topk_idx` gets the routing (MoELayer counts each expert's rows from it when asked).

The weights are stored once, in the fused layout (`LocalDecodeWeights.of`): the layer's ExpertWeights become
(strided) views of it, so the other kernels (prefill's tile-loop form) read the same memory.
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe.ffn import PL_DTYPES, cast_to, k_tile, projection, swiglu_of
from pypto_rt.kernels.moe.gate import ROW_TILE, GateShape, route_tile
from pypto_rt.kernels.moe.weights import ExpertWeights, MoEWeights

T_DYN = pl.dynamic("T_DYN")
MAX_TOKENS = ROW_TILE          # one gate tile: the router and gate run on it padded, the experts on the live rows


@dataclass(frozen=True)
class LocalDecodeShape:
    gate: GateShape
    hidden: int
    inter: int
    shared_inter: int              # 0: no shared expert
    dtype: torch.dtype             # activations, expert weights
    router_dtype: torch.dtype
    swiglu_limit: float | None


@dataclass(frozen=True)
class LocalDecodeWeights:
    """The fused layout, K-major so the GEMMs read their weights row by row (x @ W, no transpose: faster at decode
    sizes): gate_up [H, 2 N] holds one block of columns per expert, its gate then its up columns side by side
    (routed expert e at columns 2 e I .. 2 (e + 1) I, the shared expert's block last; N = E * I + I_shared), so
    one expert's gate and up are one GEMM over one contiguous run per row; down [N, H] (every routed expert's
    down rows, then the shared expert's: block b's down rows start at half its first gate_up column)."""
    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def of(cls, weights: MoEWeights) -> tuple["LocalDecodeWeights", MoEWeights]:
        """The fused layout of `weights` (bf16/FP32 experts), and `weights` with its expert tensors as views of
        it (the memory is not doubled)."""
        routed, shared = weights.experts, weights.shared
        n, inter, hidden = routed.w_gate.shape
        blocks = [torch.cat([routed.w_gate, routed.w_up], dim=1).reshape(n * 2 * inter, hidden)]
        if shared is not None:
            blocks.append(torch.cat([shared.w_gate[0], shared.w_up[0]]))
        gate_up = torch.cat(blocks).t().contiguous()
        # [n, I, H] views of the [H, 2 N] blocks: strided, not copied
        per_expert = gate_up[:, :2 * n * inter].unflatten(1, (n, 2 * inter)).permute(1, 2, 0)
        views = {("routed", "w_gate"): per_expert[:, :inter], ("routed", "w_up"): per_expert[:, inter:]}
        if shared is not None:
            block = gate_up[:, 2 * n * inter:].t().unsqueeze(0)
            views[("shared", "w_gate")], views[("shared", "w_up")] = block[:, :shared.inter], block[:, shared.inter:]
        down = torch.cat([routed.w_down.permute(0, 2, 1).reshape(n * inter, hidden)] +
                         ([shared.w_down[0].t()] if shared is not None else [])).contiguous()
        routed_down = down[:n * inter].view(n, inter, hidden).transpose(1, 2)
        routed_views = ExpertWeights(views[("routed", "w_gate")], views[("routed", "w_up")], routed_down)
        shared_views = None if shared is None else ExpertWeights(
            views[("shared", "w_gate")], views[("shared", "w_up")], down[n * inter:].t().unsqueeze(0))
        return cls(gate_up, down), dataclasses.replace(weights, experts=routed_views, shared=shared_views)


def swiglu_blocks(blocks: int, inter: int, shared_inter: int, swiglu, narrow):
    """An inline `(gu [R, 2 W] FP32, rows R) -> h [R, W]` rounded by `narrow`, W = blocks * I + I_shared: gu holds
    `blocks` [g | u] pairs of I columns, then the shared expert's pair (the fused layout's order). One swiglu over
    every block when the shared expert's width is I (or 0), the rows viewed as [R * blocks, 2 I]."""
    n, routed = blocks + (1 if shared_inter else 0), 2 * blocks * inter

    @pl.jit.inline
    def pairs(gu, rows, count):
        per_block = pl.reshape(gu, [rows * count, 2 * inter])
        return pl.reshape(narrow(swiglu(per_block[:, 0:inter], per_block[:, inter : 2 * inter])), [rows, count * inter])

    if shared_inter in (0, inter):
        @pl.jit.inline
        def swiglu_of_blocks(gu, rows):
            return pairs(gu, rows, n)
    else:
        @pl.jit.inline
        def swiglu_of_blocks(gu, rows):
            shared = narrow(swiglu(gu[:, routed : routed + shared_inter],
                                   gu[:, routed + shared_inter : routed + 2 * shared_inter]))
            return pl.concat(pairs(gu[:, 0:routed], rows, blocks), shared)

    return swiglu_of_blocks


def _dense_routes(experts: int, top_k: int):
    """An inline `(chosen [T, K] INT32, weights [T, K] FP32, t_dim) -> [T, E, 1] FP32`: each token's weight for
    every expert, 0 off its top-k (the routes compared with the expert ids at once, then summed over k)."""

    @pl.jit.inline
    def dense_routes(chosen, weights, t_dim):
        expert = pl.reshape(pl.arange(0, [1, experts], dtype=pl.INT32), [1, 1, experts])
        hit = pl.cmp(pl.reshape(chosen, [t_dim, top_k, 1]), expert, cmp_type=0)
        routed = pl.mul(pl.cast(hit, target_type=pl.FP32, mode="rint"), pl.reshape(weights, [t_dim, top_k, 1]))
        per_expert = pl.reshape(pl.transpose(routed, 1, 2), [t_dim * experts, top_k])
        return pl.reshape(pl.row_sum(per_expert), [t_dim, experts, 1])

    return dense_routes


@functools.lru_cache(maxsize=None)
def local_decode_kernel(shape: LocalDecodeShape):
    """The compiled-once fused layer for one shape: `(x [T, H], gate_weight [E, H], bias [1, E] FP32, gate_up,
    down, out [T, H] out, topk_idx [T, K] INT32 out)`, 1 <= T <= MAX_TOKENS."""
    experts, top_k, hidden, inter = shape.gate.num_experts, shape.gate.top_k, shape.hidden, shape.inter
    routed_cols, width = experts * inter, experts * inter + shape.shared_inter
    dt, rdt = PL_DTYPES[shape.dtype], PL_DTYPES[shape.router_dtype]
    mixed = dt != rdt
    router = projection(hidden, k_tile(hidden, ffn_module.K_TILE_MAX), pl.FP32,
                        cast_to(dt, pl.FP32) if mixed else None, cast_to(rdt, pl.FP32) if mixed else None)
    route, dense_routes = route_tile(shape.gate), _dense_routes(experts, top_k)
    swiglu, narrow, widen = swiglu_of(shape.swiglu_limit), cast_to(pl.FP32, dt), cast_to(dt, pl.FP32)
    gated = swiglu_blocks(experts, inter, shape.shared_inter, swiglu, narrow)

    if shape.shared_inter:
        @pl.jit.inline
        def with_shared(weighted, h):
            return pl.concat(weighted, h[:, routed_cols:width])
    else:
        @pl.jit.inline
        def with_shared(weighted, h):
            return weighted

    @pl.jit
    def moe_local_decode(
        x: pl.Tensor[[T_DYN, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        gate_up: pl.Tensor[[hidden, 2 * width], dt],
        down: pl.Tensor[[width, hidden], dt],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
        topk_idx: pl.Out[pl.Tensor[[T_DYN, top_k], pl.INT32]],
    ):
        x.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        topk_idx.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        for _ in pl.spmd(1, name_hint="moe_local_decode"):
            x_tile = pl.fillpad(pl.set_validshape(x[0:ROW_TILE, :], t_dim, hidden))
            chosen, weights = route(router(x_tile, gate_weight), bias)
            topk_idx[:, :] = chosen[0:t_dim, :]
            dense = dense_routes(chosen[0:t_dim, :], weights[0:t_dim, :], t_dim)
            gu = pl.matmul(x[0:t_dim, :], gate_up, out_dtype=pl.FP32)     # every expert's gate | up: one GEMM
            h = gated(gu, t_dim)
            per_expert = pl.reshape(widen(h[:, 0:routed_cols]), [t_dim, experts, inter])
            weighted = pl.reshape(pl.mul(per_expert, dense), [t_dim, routed_cols])
            out[:, :] = narrow(pl.matmul(with_shared(narrow(weighted), h), down, out_dtype=pl.FP32))
        return out, topk_idx

    return moe_local_decode
