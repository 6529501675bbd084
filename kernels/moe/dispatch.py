"""MoE dispatch and combine across ranks as `@pl.jit` kernels on symmetric windows (the `MoEBuffer` protocol).

Sizes: W ranks, E experts (E_LOCAL = E // W per rank, global expert e lives on rank e // E_LOCAL), K routes per
token, T_MAX tokens per rank at most, H hidden. Windows, one per rank, the same layout everywhere:

    counts_in  [W, E + W] INT32   row s: what rank s routes, per global expert (E) and per destination rank
                                  (W: how many of its tokens it sends there); the counts travel first
    tokens_in  [W * T_MAX, H]     rows s*T_MAX .. +n: rank s's tokens for this rank, each once (deduplicated)
    rows_in    [W * T_MAX, K]     INT32, per received token and route: its row in this rank's receive layout
                                  (local expert * W * T_MAX + offset), or -1 when that route is on another rank
    weights_in [W * T_MAX, K]     FP32, the route's combine weight (0 where rows_in is -1)
    back_in    [W * T_MAX, H]     rows d*T_MAX .. : rank d's weighted sums for this rank's tokens (combine)
    signals    [W, 3] INT32       column 0 counts, 1 payload, 2 combine; row s counts rank s's notifications

Every signal only grows: call i of a buffer waits until each cell reaches i (its *epoch*, kept in the
`epoch` tensor and raised by the dispatch kernel itself), so the windows are never cleared and a late signal
of an old call cannot satisfy a newer wait. Dispatch and combine alternate on a buffer (MoEBuffer checks):
a rank writes a peer's windows for call i + 1 only after its combine of call i saw that peer's combine rows,
which the peer sends after it read its windows of call i.

Dispatch (three communication regions, in program order):
1. `moe_layout`: routes -> per-expert and per-destination counts, each route's rank among its expert's rows
   from this rank (exclusive prefix counts as a matmul with a strictly lower triangular matrix), each token's
   slot in the block it sends to each destination; counts go to every rank's counts_in, then signal 0;
2. `moe_send`: once every rank's counts arrived, the receive offset of each (destination, expert) is the sum
   of the counts of lower ranks, so the sender knows each route's final row; per destination with live
   tokens it gathers those rows of x and sends them once, with their routes' rows and weights, then signal 1;
3. `moe_receive`: once every payload arrived, each received token is copied into the rows of its routes on
   this rank (a row scatter per route slot; -1 lands on a scratch row past the layout), and the counts per
   local expert are summed.
Combine (two regions): `moe_return` sums, per received token, its routes' expert rows times their weights
(the weights are applied on the expert's rank, so one row per token and rank travels back) and sends those
rows to the token's rank, then signal 2; `moe_reduce` adds, per token, the rows that came back from each rank
its routes went to.

Only live rows cross: a put carries exactly the rows a destination needs (row counts are read inside the
regions, never by the host program). The host program reads no data, so repeated calls with the same shapes
can replay with any routing.

The pieces both transports compute alike (counts, rows, blocks, expansion, weighted sums) are `@pl.jit.inline`
helpers in `dispatch_parts.py`; `dispatch_collective.py` is this protocol on collectives (no windows).
`WindowTransport` (below) holds one MoEBuffer's windows and runs these kernels on them.
"""

import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.kernels.moe.dispatch_parts import (destination_block, expand_rows, route_layout, route_rows,
                                                 sum_returned, weighted_routes)

T_DYN = pl.dynamic("T_DYN")
COUNTS_SIGNAL, PAYLOAD_SIGNAL, COMBINE_SIGNAL = 0, 1, 2
SIGNALS = 3


@dataclass(frozen=True)
class Layout:
    """What the compiled dispatch and combine depend on: the job's size and the buffer's shapes."""
    world: int
    num_experts: int
    top_k: int
    max_tokens: int
    hidden: int
    dtype: torch.dtype

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.world

    @property
    def lanes(self) -> int:
        """Receive rows per local expert: every rank may send all its tokens to one expert."""
        return self.world * self.max_tokens

    @property
    def pl_dtype(self):
        return {torch.bfloat16: pl.BF16, torch.float16: pl.FP16, torch.float32: pl.FP32}[self.dtype]


@functools.lru_cache(maxsize=None)
def dispatch_kernel(layout: Layout):
    """The compiled-once dispatch for one Layout."""
    world, n_experts, top_k, t_max, hidden = (layout.world, layout.num_experts, layout.top_k, layout.max_tokens,
                                              layout.hidden)
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype
    n_counts = n_experts + world

    @pl.jit
    def moe_dispatch(
        x: pl.Tensor[[T_DYN, hidden], dtype],
        topk_idx: pl.Tensor[[T_DYN, top_k], pl.INT32],
        topk_weights: pl.Tensor[[T_DYN, top_k], pl.FP32],
        epoch: pl.InOut[pl.Tensor[[1, 1], pl.INT32]],
        route_pos: pl.InOut[pl.Tensor[[T_DYN, top_k], pl.FP32]],
        slots: pl.InOut[pl.Tensor[[T_DYN, world], pl.FP32]],
        members: pl.InOut[pl.Tensor[[T_DYN, world], pl.FP32]],
        recv_rows: pl.InOut[pl.Tensor[[e_local * lanes + 1, hidden], dtype]],
        recv_counts: pl.InOut[pl.Tensor[[1, e_local], pl.INT32]],
        counts_in: pld.DistributedTensor[[world, n_counts], pl.INT32],
        tokens_in: pld.DistributedTensor[[lanes, hidden], dtype],
        rows_in: pld.DistributedTensor[[lanes, top_k], pl.INT32],
        weights_in: pld.DistributedTensor[[lanes, top_k], pl.FP32],
        signals: pld.DistributedTensor[[world, SIGNALS], pl.INT32],
    ):
        x.bind_dynamic(0, T_DYN)
        topk_idx.bind_dynamic(0, T_DYN)
        topk_weights.bind_dynamic(0, T_DYN)
        route_pos.bind_dynamic(0, T_DYN)
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_layout"):
            me = pld.rank(pld.get_comm_ctx(signals))
            now = pl.read(epoch, [0, 0]) + 1
            pl.write(epoch, [0, 0], now)
            count_row = route_layout(topk_idx, route_pos, slots, members, t_dim, n_experts, world, e_local)
            for peer in pl.range(world):
                pld.tile.remote_store(count_row, target=counts_in, peer=peer, offsets=[me, 0])
                pld.system.notify(signals, peer=peer, offsets=[me, COUNTS_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_send"):
            me = pld.rank(pld.get_comm_ctx(signals))
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, COUNTS_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            expert_counts = pl.cast(pl.load(counts_in, [0, 0], [world, n_experts]), pl.FP32)
            row_ids = route_rows(expert_counts, me, topk_idx, route_pos, t_dim, world, e_local, lanes)
            for d in pl.range(world):
                n = pl.read(counts_in, [me, n_experts + d])
                if n > 0:
                    tokens, rows, weights = destination_block(x, topk_idx, topk_weights, row_ids, slots, members,
                                                              d, n, e_local, t_max)
                    pld.tile.remote_store(tokens, target=tokens_in, peer=d, offsets=[me * t_max, 0])
                    pld.tile.remote_store(rows, target=rows_in, peer=d, offsets=[me * t_max, 0])
                    pld.tile.remote_store(weights, target=weights_in, peer=d, offsets=[me * t_max, 0])
            for peer in pl.range(world):
                pld.system.notify(signals, peer=peer, offsets=[me, PAYLOAD_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_receive"):
            me = pld.rank(pld.get_comm_ctx(signals))
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, PAYLOAD_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            mine = pl.load(counts_in, [0, me * e_local], [world, e_local])
            recv_counts[:, :] = pl.cast(pl.col_sum(pl.cast(mine, pl.FP32)), pl.INT32)
            scratch = e_local * lanes
            for src in pl.range(world):
                n = pl.read(counts_in, [src, n_experts + me])
                if n > 0:
                    recv_rows = expand_rows(recv_rows, tokens_in[src * t_max : src * t_max + n, :],
                                            rows_in[src * t_max : src * t_max + n, :], n, scratch)
        return recv_rows, recv_counts

    return moe_dispatch


@functools.lru_cache(maxsize=None)
def combine_kernel(layout: Layout):
    """The compiled-once combine for one Layout."""
    world, n_experts, top_k, t_max, hidden = (layout.world, layout.num_experts, layout.top_k, layout.max_tokens,
                                              layout.hidden)
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype
    n_counts = n_experts + world

    @pl.jit
    def moe_combine(
        y: pl.Tensor[[e_local * lanes, hidden], dtype],
        epoch: pl.Tensor[[1, 1], pl.INT32],
        slots: pl.Tensor[[T_DYN, world], pl.FP32],
        members: pl.Tensor[[T_DYN, world], pl.FP32],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dtype]],
        counts_in: pld.DistributedTensor[[world, n_counts], pl.INT32],
        rows_in: pld.DistributedTensor[[lanes, top_k], pl.INT32],
        weights_in: pld.DistributedTensor[[lanes, top_k], pl.FP32],
        back_in: pld.DistributedTensor[[lanes, hidden], dtype],
        signals: pld.DistributedTensor[[world, SIGNALS], pl.INT32],
    ):
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(out, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_return"):
            me = pld.rank(pld.get_comm_ctx(signals))
            for src in pl.range(world):
                n = pl.read(counts_in, [src, n_experts + me])
                if n > 0:
                    total = weighted_routes(y, rows_in[src * t_max : src * t_max + n, :],
                                            weights_in[src * t_max : src * t_max + n, :], n, hidden)
                    pld.tile.remote_store(pl.cast(total, dtype), target=back_in, peer=src, offsets=[me * t_max, 0])
            for peer in pl.range(world):
                pld.system.notify(signals, peer=peer, offsets=[me, COMBINE_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce"):
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, COMBINE_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            starts = pl.mul(pl.cast(pl.arange(0, [1, world], dtype=pl.INT32), pl.FP32), float(t_max))   # d * T_MAX
            total = sum_returned(back_in, slots, members, starts, t_dim, hidden, world)
            out[:, :] = pl.cast(total, dtype)
        return out

    return moe_combine


def _window(shape: list[int], dtype) -> torch.Tensor:
    return pld.window(pld.alloc_window_buffer(shape, dtype=dtype), shape, dtype=dtype)


class WindowTransport:
    """How MoEBuffer's rows cross on a communicator with symmetric windows (shm): the windows above, allocated
    once (COLLECTIVE: every rank, in the same order), and the epoch that numbers the calls."""

    def __init__(self, layout: Layout):
        self.layout = layout
        world, lanes, k, hidden = layout.world, layout.lanes, layout.top_k, layout.hidden
        self._counts_in = _window([world, layout.num_experts + world], pl.INT32)
        self._tokens_in = _window([lanes, hidden], layout.pl_dtype)
        self._rows_in = _window([lanes, k], pl.INT32)
        self._weights_in = _window([lanes, k], pl.FP32)
        self._back_in = _window([lanes, hidden], layout.pl_dtype)
        self._signals = _window([world, SIGNALS], pl.INT32)
        self._epoch = torch.zeros(1, 1, dtype=torch.int32)

    def dispatch(self, x, topk_idx, topk_weights, route_pos, slots, members, recv_rows, recv_counts) -> None:
        dispatch_kernel(self.layout)(x, topk_idx, topk_weights, self._epoch, route_pos, slots, members, recv_rows,
                                     recv_counts, self._counts_in, self._tokens_in, self._rows_in, self._weights_in,
                                     self._signals)

    def combine(self, y, slots, members, out) -> None:
        combine_kernel(self.layout)(y, self._epoch, slots, members, out, self._counts_in, self._rows_in,
                                    self._weights_in, self._back_in, self._signals)

    def sent_rows(self, rank: int) -> list[int]:
        """Token rows `rank`'s latest dispatch sent to each rank."""
        return self._counts_in[rank, self.layout.num_experts:].tolist()
