"""MoE dispatch and combine in a plain process (world 1, not launched): the `MoEBuffer` protocol of `dispatch.py`
with no windows and no communicator, so a model runs its MoE layers in one process with the same results.

With one rank every route lives here: the receive layout, the per-expert counts and the rounding of the weighted
sums are the windows version's (the same `dispatch_parts.py` layout pieces), the token rows are copied straight
from x instead of crossing a window, and as no route slot lives elsewhere none is compacted, so no region reads a
count: repeated calls with the same token count replay as recorded torch calls whatever the routing. Buffer:
`meta` [T_MAX, 2K] FP32, per token its routes' receive rows, then their weights (written by dispatch, read by
combine). T = 0 is legal (nothing is copied, the counts are zero).
"""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.moe.dispatch import T_DYN, Layout
from pypto_rt.kernels.moe.dispatch_parts import k_major, route_layout, route_rows


@pl.jit.inline
def token_of_routes(t_dim, top_k):
    """[K * T, 1] INT32: the token of each route slot in route-slot-major order (slot k of token t at k * T + t)."""
    return k_major(pl.row_expand(pl.full([t_dim, top_k], dtype=pl.INT32, value=0),
                                 pl.reshape(pl.arange(0, [1, t_dim], dtype=pl.INT32), [t_dim, 1])), t_dim, top_k)


@functools.lru_cache(maxsize=None)
def dispatch_kernel(layout: Layout):
    """The compiled-once local dispatch for one Layout (layout.world == 1)."""
    n_experts, top_k, t_max, hidden = layout.num_experts, layout.top_k, layout.max_tokens, layout.hidden
    lanes, dtype = layout.lanes, layout.pl_dtype

    @pl.jit
    def moe_dispatch_local(
        x: pl.Tensor[[T_DYN, hidden], dtype],
        topk_idx: pl.Tensor[[T_DYN, top_k], pl.INT32],
        topk_weights: pl.Tensor[[T_DYN, top_k], pl.FP32],
        route_pos: pl.InOut[pl.Tensor[[T_DYN, top_k], pl.FP32]],
        slots: pl.InOut[pl.Tensor[[T_DYN, 1], pl.FP32]],
        members: pl.InOut[pl.Tensor[[T_DYN, 1], pl.FP32]],
        meta: pl.InOut[pl.Tensor[[t_max, 2 * top_k], pl.FP32]],
        recv_rows: pl.InOut[pl.Tensor[[n_experts * lanes + 1, hidden], dtype]],
        recv_counts: pl.InOut[pl.Tensor[[1, n_experts], pl.INT32]],
    ):
        x.bind_dynamic(0, T_DYN)
        topk_idx.bind_dynamic(0, T_DYN)
        topk_weights.bind_dynamic(0, T_DYN)
        route_pos.bind_dynamic(0, T_DYN)
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_route_local"):
            count_row = route_layout(topk_idx, route_pos, slots, members, t_dim, n_experts, 1, n_experts, top_k)
            recv_counts[:, :] = count_row[:, 0:n_experts]
            if t_dim > 0:
                taken = pl.full([1, n_experts + 1], dtype=pl.FP32, value=0.0)
                rows = route_rows(taken, topk_idx, route_pos, t_dim, n_experts, n_experts, lanes)
                meta[0:t_dim, 0:top_k] = rows
                meta[0:t_dim, top_k : 2 * top_k] = topk_weights
                copies = pl.mgather(x, token_of_routes(t_dim, top_k), coalesce="row")
                # distinct receive rows (a token routes to an expert once): no last-writer pass
                recv_rows = pl.mscatter(copies, k_major(pl.cast(rows, pl.INT32, mode="trunc"), t_dim, top_k),
                                        recv_rows, coalesce="row", scatter_conflict="default")
        return recv_rows, recv_counts

    return moe_dispatch_local


@functools.lru_cache(maxsize=None)
def combine_kernel(layout: Layout):
    """The compiled-once local combine for one Layout (layout.world == 1)."""
    n_experts, top_k, t_max, hidden = layout.num_experts, layout.top_k, layout.max_tokens, layout.hidden
    lanes, dtype = layout.lanes, layout.pl_dtype

    @pl.jit
    def moe_combine_local(
        y: pl.Tensor[[n_experts * lanes, hidden], dtype],
        meta: pl.Tensor[[t_max, 2 * top_k], pl.FP32],
        addend: pl.Tensor[[T_DYN, hidden], dtype],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dtype]],
    ):
        addend.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(out, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce_local"):
            if t_dim > 0:
                rows = k_major(pl.cast(meta[0:t_dim, 0:top_k], pl.INT32, mode="trunc"), t_dim, top_k)
                weights = k_major(meta[0:t_dim, top_k : 2 * top_k], t_dim, top_k)
                weighted = pl.row_expand_mul(pl.cast(pl.mgather(y, rows, coalesce="row"), pl.FP32), weights)
                routed = pl.reshape(pl.col_sum(pl.reshape(weighted, [top_k, t_dim * hidden])), [t_dim, hidden])
                routed = pl.cast(pl.cast(routed, dtype, mode="rint"), pl.FP32)
                out[:, :] = pl.cast(pl.add(routed, pl.cast(addend, pl.FP32)), dtype, mode="rint")
        return out

    return moe_combine_local


class LocalTransport:
    """How MoEBuffer's rows move in a process that was not launched (world 1): no windows, no communicator."""

    def __init__(self, layout: Layout, rank: int):
        assert layout.world == 1 and rank == 0, "LocalTransport serves a world of one rank"
        self.layout, self.rank = layout, rank
        self._meta = torch.zeros(layout.max_tokens, 2 * layout.top_k, dtype=torch.float32)
        self._tokens = 0

    def dispatch(self, x, topk_idx, topk_weights, route_pos, slots, members, recv_rows, recv_counts) -> None:
        dispatch_kernel(self.layout)(x, topk_idx, topk_weights, route_pos, slots, members, self._meta, recv_rows,
                                     recv_counts)
        self._tokens = x.shape[0]

    def combine(self, y, slots, members, addend, out) -> None:
        combine_kernel(self.layout)(y, self._meta, addend, out)

    def sent_rows(self, rank: int) -> list[int]:
        """Token rows the latest dispatch moved (to this, the only rank)."""
        return [self._tokens]

    def signals_untouched(self) -> bool:
        """Nothing signals in a local job (a check for tests)."""
        return True
