"""MoE dispatch and combine as `@pl.jit` kernels on collectives: the `MoEBuffer` protocol of `dispatch.py` for a
communicator without windows (the torch communicator: gloo on CPU, nccl / hccl on accelerators).

The same counts, rows and receive layout as the windows version (their shared pieces are in `dispatch_parts.py`);
collectives move the rows where that version stores into peers' windows. Buffers, plain tensors of this rank:

    counts     [W, E + W] INT32   every rank's count row (routes per global expert, then tokens per destination)
    send_x     [W * T_MAX + 1, H] this rank's token rows packed per destination rank in rank order, each token
                                  once per destination (+ a spill row)
    send_meta  [W * T_MAX + 1, 2K] FP32, per sent token: its meta row (dispatch_parts.py)
    recv_x, recv_meta             what arrived, packed per source rank in rank order
    back_send, back_recv [W * T_MAX, H]   combine's weighted sums per received token, and what came back (back_recv
                                          + a zero row, never written: `sum_returned`)

Dispatch: `moe_layout` counts (as the windows version) and allgathers the count rows; `moe_send` computes each
route's row, packs the per-destination blocks and moves them with two all_to_all_v (the token rows in the
config's dtype, the rows and weights as FP32); `moe_receive` copies each arrived token into its routes' rows.
Combine: `moe_return` sums each received token's routes times their weights (applied on the expert's rank, so one
row per token and rank returns) and sends them back with the reverse all_to_all_v; `moe_reduce` sums per token.
Only live rows cross: all_to_all_v sends the first sum(send_counts) rows of its input, no padding.

What differs from windows: all_to_all_v takes its split sizes as host lists (gloo's and NCCL's
all_to_all_single do), so each one reads 2W counts into the host: a call is not host-sync free, and a run that
communicates this way is not recorded for replay. No epochs: collectives match by call order on every rank.
"""
import functools

import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.kernels.moe.dispatch import T_DYN, Layout
from pypto_rt.kernels.moe.dispatch_parts import (expand_arrived, lower_ranks_take, prefix_matrix, route_layout,
                                                 route_rows, stage_by_destination, sum_returned, sums_by_chunk)


@pl.jit.inline
def row_starts(sizes, n):
    """[1, n] INT32: exclusive prefix sums of the [1, n] INT32 `sizes` (where each block starts when packed)."""
    column = pl.reshape(pl.cast(sizes, pl.FP32, mode="rint"), [n, 1])
    return pl.cast(pl.reshape(pl.matmul(prefix_matrix(n), column), [1, n]), pl.INT32, mode="trunc")


@pl.jit.inline
def row_total(column):
    """The sum of a [W, 1] INT32 column of row counts, as a scalar."""
    return pl.read(pl.cast(pl.col_sum(pl.cast(column, pl.FP32, mode="rint")), pl.INT32, mode="trunc"), [0, 0])


@functools.lru_cache(maxsize=None)
def dispatch_kernel(layout: Layout):
    """The compiled-once collective dispatch for one Layout."""
    world, n_experts, top_k, hidden = layout.world, layout.num_experts, layout.top_k, layout.hidden
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype
    n_counts = n_experts + world

    @pl.jit
    def moe_dispatch_collective(
        x: pl.Tensor[[T_DYN, hidden], dtype],
        topk_idx: pl.Tensor[[T_DYN, top_k], pl.INT32],
        topk_weights: pl.Tensor[[T_DYN, top_k], pl.FP32],
        me: pl.Scalar[pl.INT32],
        route_pos: pl.InOut[pl.Tensor[[T_DYN, top_k], pl.FP32]],
        slots: pl.InOut[pl.Tensor[[T_DYN, world], pl.FP32]],
        members: pl.InOut[pl.Tensor[[T_DYN, world], pl.FP32]],
        recv_rows: pl.InOut[pl.Tensor[[e_local * lanes + 1, hidden], dtype]],
        recv_counts: pl.InOut[pl.Tensor[[1, e_local], pl.INT32]],
        counts: pl.InOut[pl.Tensor[[world, n_counts], pl.INT32]],
        send_x: pl.InOut[pl.Tensor[[lanes + 1, hidden], dtype]],
        send_meta: pl.InOut[pl.Tensor[[lanes + 1, 2 * top_k], pl.FP32]],
        recv_x: pl.InOut[pl.Tensor[[lanes, hidden], dtype]],
        recv_meta: pl.InOut[pl.Tensor[[lanes, 2 * top_k], pl.FP32]],
    ):
        x.bind_dynamic(0, T_DYN)
        topk_idx.bind_dynamic(0, T_DYN)
        topk_weights.bind_dynamic(0, T_DYN)
        route_pos.bind_dynamic(0, T_DYN)
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_layout"):
            count_row = route_layout(topk_idx, route_pos, slots, members, t_dim, n_experts, world, e_local, top_k)
            pld.allgather(counts, pl.reshape(count_row, [n_counts]))

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_send"):
            taken = lower_ranks_take(counts, me, world)
            row_ids = route_rows(taken, topk_idx, route_pos, t_dim, n_experts, e_local, lanes)
            sent = pl.load(counts, [me, n_experts], [1, world])           # tokens to each rank
            send_x, send_meta = stage_by_destination(x, topk_idx, topk_weights, row_ids, slots, members,
                                                     row_starts(sent, world), send_x, send_meta, t_dim, world,
                                                     e_local, top_k, lanes)
            arrivals = pl.load(counts, [0, n_experts + me], [world, 1])
            pld.all_to_all_v(recv_x, send_x, send_counts=sent, recv_counts=arrivals)
            pld.all_to_all_v(recv_meta, send_meta, send_counts=sent, recv_counts=arrivals)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_receive"):
            mine = pl.load(counts, [0, me * e_local], [world, e_local])
            recv_counts[:, :] = pl.cast(pl.col_sum(pl.cast(mine, pl.FP32, mode="rint")), pl.INT32, mode="trunc")
            n = row_total(pl.load(counts, [0, n_experts + me], [world, 1]))
            if n > 0:
                rows = pl.cast(recv_meta[0:n, 0:top_k], pl.INT32, mode="trunc")
                recv_rows = expand_arrived(recv_rows, recv_x, rows, n, top_k)
        return recv_rows, recv_counts

    return moe_dispatch_collective


@functools.lru_cache(maxsize=None)
def combine_kernel(layout: Layout):
    """The compiled-once collective combine for one Layout."""
    world, n_experts, top_k, hidden = layout.world, layout.num_experts, layout.top_k, layout.hidden
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype
    n_counts = n_experts + world

    @pl.jit
    def moe_combine_collective(
        y: pl.Tensor[[e_local * lanes, hidden], dtype],
        me: pl.Scalar[pl.INT32],
        slots: pl.Tensor[[T_DYN, world], pl.FP32],
        members: pl.Tensor[[T_DYN, world], pl.FP32],
        addend: pl.Tensor[[T_DYN, hidden], dtype],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dtype]],
        counts: pl.Tensor[[world, n_counts], pl.INT32],
        recv_meta: pl.Tensor[[lanes, 2 * top_k], pl.FP32],
        back_send: pl.InOut[pl.Tensor[[lanes, hidden], dtype]],
        back_recv: pl.InOut[pl.Tensor[[lanes + 1, hidden], dtype]],
    ):
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        addend.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(out, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_return"):
            arrivals = pl.load(counts, [0, n_experts + me], [world, 1])
            n = row_total(arrivals)
            if n > 0:
                back_send = sums_by_chunk(back_send, 0, y, recv_meta[0:n, :],
                                          pl.cast(recv_meta[0:n, 0:top_k], pl.INT32, mode="trunc"), n, top_k, hidden,
                                          dtype)
            sent = pl.load(counts, [me, n_experts], [1, world])
            pld.all_to_all_v(back_recv, back_send, send_counts=arrivals, recv_counts=sent)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce"):
            starts = row_starts(pl.load(counts, [me, n_experts], [1, world]), world)
            total = sum_returned(back_recv, slots, members, starts, lanes, t_dim, hidden, world)
            out[:, :] = pl.cast(pl.add(total, pl.cast(addend, pl.FP32)), dtype, mode="rint")
        return out

    return moe_combine_collective


class CollectiveTransport:
    """How MoEBuffer's rows cross on a communicator without windows (gloo / nccl / hccl): the buffers above, this
    rank's own, allocated once."""

    def __init__(self, layout: Layout, rank: int):
        self.layout, self.rank = layout, rank
        lanes, meta, hidden = layout.lanes, 2 * layout.top_k, layout.hidden
        self._counts = torch.zeros(layout.world, layout.num_experts + layout.world, dtype=torch.int32)
        self._send_x = torch.zeros(lanes + 1, hidden, dtype=layout.dtype)
        self._send_meta = torch.zeros(lanes + 1, meta, dtype=torch.float32)
        self._recv_x = torch.zeros(lanes, hidden, dtype=layout.dtype)
        self._recv_meta = torch.zeros(lanes, meta, dtype=torch.float32)
        self._back_send = torch.zeros(lanes, hidden, dtype=layout.dtype)
        self._back_recv = torch.zeros(lanes + 1, hidden, dtype=layout.dtype)   # + a zero row (sum_returned)

    def dispatch(self, x, topk_idx, topk_weights, route_pos, slots, members, recv_rows, recv_counts) -> None:
        dispatch_kernel(self.layout)(x, topk_idx, topk_weights, self.rank, route_pos, slots, members, recv_rows,
                                     recv_counts, self._counts, self._send_x, self._send_meta, self._recv_x,
                                     self._recv_meta)

    def combine(self, y, slots, members, addend, out) -> None:
        combine_kernel(self.layout)(y, self.rank, slots, members, addend, out, self._counts, self._recv_meta,
                                    self._back_send, self._back_recv)

    def sent_rows(self, rank: int) -> list[int]:
        """Token rows `rank`'s latest dispatch sent to each rank."""
        return self._counts[rank, self.layout.num_experts:].tolist()

    def signals_untouched(self) -> bool:
        """No call has exchanged counts yet (a check for tests: a refused call sends nothing)."""
        return not self._counts.any()
