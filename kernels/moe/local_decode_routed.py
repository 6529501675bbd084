"""The one-rank MoE decode layer for a batch whose routes reach every expert (T * K >= E), in the routed capacity
form: each expert runs on C slot rows, its own routes', instead of on every token row (the dense form's E / K
times the routed FLOPs).

    route: logits = x @ router.T -> gate -> (topk_idx, w) [T, K]              the gate's own inline (gate.route_tile)
    slots: route r = t K + k of expert e goes to slot e C + j, j = how many earlier routes chose e (j >= C: the
           call is discarded, below). All by one-hot compares and small exact FP32 matmuls, so the slot layout is
           tile data: no value is read into the program and every call replays, whatever the routing
    x_slot [E, C, H] = Q @ x (Q [E C, T]: slot s holds token t; an empty slot a zero row), w_slot [E, C, 1]
    [g | u] = x_slot @ [W_gate | W_up] per expert (batched over E); h = swiglu(g, u) rounded; h *= w_slot, rounded
    y [E C, H] = h @ W_down per expert (FP32)
    out = round(Q.T @ y + swiglu(x @ shared) @ W_down_shared)                 the routes summed in FP32, rounded once

Why a capacity form and not data extents (each expert's count and offset read with `pl.read`): a replay keeps
every shape static (a slice's extent read from data is guarded to its recorded value, replay/capture.py), so a
per-expert row count would send a call with new routing to the engine. The slot layout costs E * C rows whatever
the routing (an expert with no routes computes C zero rows); C is set from the batch (`capacity`). The kernel
returns each expert's route count; the caller reruns the call in the dense form when one exceeds C (a route past
its expert's slots lands on the next expert's), so skewed routing stays correct. The rounding points are the
dense form's (h, w * h, the sum once). `uses_routed` says for which batches the form is picked (measured).
"""
import functools
import math
from dataclasses import dataclass

import torch

import pypto.language as pl
from pypto_rt.kernels.moe import ffn as ffn_module
from pypto_rt.kernels.moe.ffn import PL_DTYPES, cast_to, k_tile, projection, swiglu_of
from pypto_rt.kernels.moe.gate import route_tile
from pypto_rt.kernels.moe.local_decode import LocalDecodeShape, LocalDecodeWeights


def capacity(shape: LocalDecodeShape, tokens: int) -> int:
    """Slots per expert for `tokens` rows: the mean routes per expert m = T K / E plus 3 sqrt(m) (a count's spread
    under balanced routing: past it the call runs twice), at most `tokens` (a token routes to an expert once, so
    `tokens` slots never overflow). Measured at E = 8, K = 2 (README benchmark 12): overflow in 0-2% of random
    batches at T = 8 and 32, where 2 m slots overflowed in 24% at T = 8."""
    mean = tokens * shape.gate.top_k / shape.gate.num_experts
    return min(tokens, math.ceil(mean + 3 * math.sqrt(mean)))


@dataclass(frozen=True)
class RoutedViews:
    """The routed experts' weights as batched operands, strided views of the fused layout (no copy): gate and up
    [E, H, I] (expert e's column block of gate_up), down [E, I, H]."""
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def of(cls, fused: LocalDecodeWeights, shape: LocalDecodeShape) -> "RoutedViews":
        experts, hidden, inter = shape.gate.num_experts, shape.hidden, shape.inter
        per_expert = fused.gate_up[:, :2 * experts * inter].view(hidden, experts, 2 * inter).transpose(0, 1)
        return cls(per_expert[:, :, :inter], per_expert[:, :, inter:],
                   fused.down[:experts * inter].view(experts, inter, hidden))


def _slot_layout(tokens: int, experts: int, top_k: int, slots_per_expert: int):
    """An inline `(chosen [T, K] INT32, weights [T, K] FP32) -> (Q [S, T] FP32 one-hot, w_slot [S, 1] FP32,
    counts [1, E] FP32)` with S = E * C. Every matmul below multiplies 0/1 by small integers or by one weight and
    zeros, so it is exact in FP32; the tiles made from constants alone are computed once, when recorded. A route
    past the capacity lands on another route's slot: the caller discards such a call's result (its counts)."""
    routes, slots, c = tokens * top_k, experts * slots_per_expert, slots_per_expert

    @pl.jit.inline
    def as_fp32(mask):
        return pl.cast(mask, target_type=pl.FP32, mode="rint")

    @pl.jit.inline
    def slot_layout(chosen, weights):
        route = pl.reshape(pl.arange(0, [1, routes], dtype=pl.INT32), [routes, 1])
        earlier = as_fp32(pl.cmp(route, pl.arange(0, [1, routes], dtype=pl.INT32), cmp_type=4))    # [R, R]: r' < r
        first = pl.muls(pl.arange(0, [1, tokens], dtype=pl.INT32), top_k)
        owner = pl.sub(as_fp32(pl.cmp(route, first, cmp_type=5)),                                # [R, T]: r // K == t
                       as_fp32(pl.cmp(route, pl.adds(first, top_k), cmp_type=5)))
        slot_ids = as_fp32(pl.reshape(pl.arange(0, [1, slots], dtype=pl.INT32), [slots, 1]))
        first_slot = as_fp32(pl.muls(pl.arange(0, [1, experts], dtype=pl.INT32), c))
        hit = as_fp32(pl.cmp(pl.reshape(chosen, [routes, 1]), pl.arange(0, [1, experts], dtype=pl.INT32),
                             cmp_type=0))                                                           # [R, E]
        # route r's slot: its expert's first slot + how many earlier routes chose that expert
        slot = pl.row_sum(pl.mul(pl.col_expand_add(pl.matmul(earlier, hit, out_dtype=pl.FP32), first_slot), hit))
        slot_of = as_fp32(pl.cmp(slot_ids, pl.reshape(slot, [1, routes]), cmp_type=0))            # [S, R]
        q = pl.matmul(slot_of, owner, out_dtype=pl.FP32)
        w_slot = pl.matmul(slot_of, pl.reshape(weights, [routes, 1]), out_dtype=pl.FP32)
        return q, w_slot, pl.col_sum(hit)

    return slot_layout


@functools.lru_cache(maxsize=None)
def local_routed_kernel(shape: LocalDecodeShape, tokens: int, slots_per_expert: int):
    """`(x [T, H], gate_weight [E, H], bias [1, E] FP32, gate_up, down, w_gate [E, H, I], w_up [E, H, I],
    w_down [E, I, H] (RoutedViews), out [T, H] out, topk_idx [T, K] INT32 out, counts [1, E] FP32 out)`."""
    experts, top_k, hidden, inter = shape.gate.num_experts, shape.gate.top_k, shape.hidden, shape.inter
    shared_inter, c = shape.shared_inter, slots_per_expert
    routed_cols, width = experts * inter, experts * inter + shared_inter
    dt, rdt = PL_DTYPES[shape.dtype], PL_DTYPES[shape.router_dtype]
    mixed = dt != rdt
    router = projection(hidden, k_tile(hidden, ffn_module.K_TILE_MAX), pl.FP32,
                        cast_to(dt, pl.FP32) if mixed else None, cast_to(rdt, pl.FP32) if mixed else None)
    route, layout = route_tile(shape.gate, rows=tokens), _slot_layout(tokens, experts, top_k, c)
    swiglu, narrow, widen = swiglu_of(shape.swiglu_limit), cast_to(pl.FP32, dt), cast_to(dt, pl.FP32)

    if shared_inter:
        @pl.jit.inline
        def plus_shared(acc, x, gate_up, down):
            gu = pl.matmul(x, gate_up[:, 2 * routed_cols : 2 * width], out_dtype=pl.FP32)   # its gate | up
            h = narrow(swiglu(gu[:, 0:shared_inter], gu[:, shared_inter : 2 * shared_inter]))
            return pl.matmul_acc(acc, h, down[routed_cols:width, :])
    else:
        @pl.jit.inline
        def plus_shared(acc, x, gate_up, down):
            return acc

    @pl.jit
    def moe_local_routed(
        x: pl.Tensor[[tokens, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        gate_up: pl.Tensor[[hidden, 2 * width], dt],
        down: pl.Tensor[[width, hidden], dt],
        w_gate: pl.Tensor[[experts, hidden, inter], dt],
        w_up: pl.Tensor[[experts, hidden, inter], dt],
        w_down: pl.Tensor[[experts, inter, hidden], dt],
        out: pl.Out[pl.Tensor[[tokens, hidden], dt]],
        topk_idx: pl.Out[pl.Tensor[[tokens, top_k], pl.INT32]],
        counts: pl.Out[pl.Tensor[[1, experts], pl.FP32]],
    ):
        for _ in pl.spmd(1, name_hint="moe_local_routed"):
            x_rows = x[0:tokens, :]
            chosen, weights = route(router(x_rows, gate_weight), bias)
            topk_idx[:, :] = chosen
            q, w_slot, hits = layout(chosen, weights)
            counts[:, :] = hits
            x_slot = pl.reshape(pl.matmul(q, x_rows, out_dtype=dt), [experts, c, hidden])   # exact: one-hot rows
            g = pl.matmul(x_slot, w_gate[0:experts, :, :], out_dtype=pl.FP32)
            u = pl.matmul(x_slot, w_up[0:experts, :, :], out_dtype=pl.FP32)
            h = widen(narrow(swiglu(g, u)))
            weighted = narrow(pl.mul(h, pl.reshape(w_slot, [experts, c, 1])))
            y = pl.reshape(pl.matmul(weighted, w_down[0:experts, :, :], out_dtype=pl.FP32), [experts * c, hidden])
            acc = pl.matmul(q, y, a_trans=True, out_dtype=pl.FP32)                      # each token's routes
            out[:, :] = narrow(plus_shared(acc, x_rows, gate_up, down))
        return out, topk_idx, counts

    return moe_local_routed


# the routed form is picked when its slot rows (E * C) are at most this share of the dense form's expert rows (E * T):
# measured at E = 8, K = 2, H = I = 256 (README benchmark 12, CPU time, alternating): at T = 4 and 8 (C / T = 1 and
# 7 / 8) the two tie or the dense form is ahead (fewer calls, every expert's weights read either way); at T = 16
# (10 / 16) the routed layer takes 8-18% less, at T = 32 (17 / 32) 14-23%
ROUTED_MAX_ROW_SHARE = 2 / 3


def uses_routed(shape: LocalDecodeShape, tokens: int) -> bool:
    """A batch whose routes reach every expert (T * K >= E) and whose slots per expert are a small enough share of
    its tokens (ROUTED_MAX_ROW_SHARE) that the FLOPs saved outweigh the slot layout's calls."""
    experts, top_k = shape.gate.num_experts, shape.gate.top_k
    return tokens * top_k >= experts and capacity(shape, tokens) <= ROUTED_MAX_ROW_SHARE * tokens
