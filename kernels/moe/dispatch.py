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
"""

import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
import pypto.language.distributed as pld

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


@pl.jit.inline
def _prefix_matrix(t_dim):
    """[T, T] FP32 with 1 where column < row: `matmul(prefix, m)` counts, per row, the ones above it in m."""
    rows = pl.row_expand(pl.full([t_dim, t_dim], dtype=pl.INT32, value=0),
                         pl.reshape(pl.arange(0, [1, t_dim], dtype=pl.INT32), [t_dim, 1]))
    cols = pl.col_expand(pl.full([t_dim, t_dim], dtype=pl.INT32, value=0), pl.arange(0, [1, t_dim], dtype=pl.INT32))
    return pl.sel(pl.cmp(cols, rows, cmp_type=2), pl.full([t_dim, t_dim], dtype=pl.FP32, value=1.0),
                  pl.full([t_dim, t_dim], dtype=pl.FP32, value=0.0))


@pl.jit.inline
def _route_tokens(n, top_k):
    """[n * top_k, 1] INT32: row j * top_k + k holds j (the token of each route slot)."""
    tokens = pl.reshape(pl.arange(0, [1, n], dtype=pl.INT32), [n, 1])
    return pl.reshape(pl.row_expand(pl.full([n, top_k], dtype=pl.INT32, value=0), tokens), [n * top_k, 1])


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
            experts = pl.col_expand(pl.full([t_dim, n_experts], dtype=pl.INT32, value=0),
                                    pl.arange(0, [1, n_experts], dtype=pl.INT32))
            ones = pl.full([t_dim, n_experts], dtype=pl.FP32, value=1.0)
            zeros = pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0)
            routed = pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0)
            for k in pl.range(top_k):
                hit = pl.cmp(experts, pl.row_expand(experts, topk_idx[:, k : k + 1]), cmp_type=0)
                routed = pl.add(routed, pl.sel(hit, ones, zeros))
            prefix = _prefix_matrix(t_dim)
            # a route's rank among this rank's rows for its expert (top-k experts of a token are distinct)
            route_pos[:, :] = pl.gather(pl.matmul(prefix, routed), dim=-1, index=topk_idx)
            goes = pl.full([t_dim, world], dtype=pl.FP32, value=0.0)    # 1 where a token has a route on rank d
            for d in pl.range(world):
                goes[:, d : d + 1] = pl.row_max(routed[:, d * e_local : (d + 1) * e_local])
            members[:, :] = goes
            slots[:, :] = pl.matmul(prefix, goes)
            counts = pl.full([1, n_counts], dtype=pl.FP32, value=0.0)
            counts[:, 0:n_experts] = pl.col_sum(routed)
            counts[:, n_experts:n_counts] = pl.col_sum(goes)
            count_row = pl.cast(counts, pl.INT32)
            for peer in pl.range(world):
                pld.tile.remote_store(count_row, target=counts_in, peer=peer, offsets=[me, 0])
                pld.system.notify(signals, peer=peer, offsets=[me, COUNTS_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_send"):
            me = pld.rank(pld.get_comm_ctx(signals))
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, COUNTS_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            all_counts = pl.cast(pl.load(counts_in, [0, 0], [world, n_experts]), pl.FP32)
            lower = pl.cmps(pl.arange(0, [1, world], dtype=pl.INT32), me, cmp_type=2)
            before = pl.sel(lower, pl.full([1, world], dtype=pl.FP32, value=1.0),
                            pl.full([1, world], dtype=pl.FP32, value=0.0))
            offsets = pl.matmul(before, all_counts)            # [1, E]: rows lower ranks take per expert
            base = pl.full([1, n_experts], dtype=pl.FP32, value=0.0)
            local = pl.mul(pl.cast(pl.arange(0, [1, e_local], dtype=pl.INT32), pl.FP32), float(lanes))
            for d in pl.range(world):
                base[:, d * e_local : (d + 1) * e_local] = pl.add(offsets[:, d * e_local : (d + 1) * e_local], local)
            rows = pl.add(pl.gather(pl.col_expand(pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0), base),
                                    dim=-1, index=topk_idx), route_pos)
            row_ids = pl.cast(rows, pl.INT32)
            no_row = pl.full([t_dim, top_k], dtype=pl.INT32, value=-1)
            no_weight = pl.full([t_dim, top_k], dtype=pl.FP32, value=0.0)
            token_ids = pl.reshape(pl.arange(0, [1, t_dim], dtype=pl.INT32), [t_dim, 1])
            for d in pl.range(world):
                n = pl.read(counts_in, [me, n_experts + d])
                if n > 0:
                    there = pl.and_(pl.cmps(topk_idx, d * e_local, cmp_type=5),
                                    pl.cmps(topk_idx, (d + 1) * e_local, cmp_type=2))
                    slot = pl.cast(slots[:, d : d + 1], pl.INT32)
                    goes = pl.cmps(members[:, d : d + 1], 0.5, cmp_type=4)
                    order = pl.full([t_max + 1, 1], dtype=pl.INT32, value=0)
                    order = pl.scatter_update(order, 0, pl.sel(goes, slot, pl.full([t_dim, 1], dtype=pl.INT32,
                                                                                      value=t_max)), token_ids)
                    picked = order[0:n, :]
                    pld.tile.remote_store(pl.mgather(x, picked, coalesce="row"), target=tokens_in, peer=d,
                                          offsets=[me * t_max, 0])
                    pld.tile.remote_store(pl.mgather(pl.sel(there, row_ids, no_row), picked, coalesce="row"),
                                          target=rows_in, peer=d, offsets=[me * t_max, 0])
                    pld.tile.remote_store(pl.mgather(pl.sel(there, topk_weights, no_weight), picked,
                                                     coalesce="row"),
                                          target=weights_in, peer=d, offsets=[me * t_max, 0])
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
                    # each arrived token once per route slot: slot k of token j is row j * top_k + k
                    routes = n * top_k
                    targets = pl.reshape(rows_in[src * t_max : src * t_max + n, :], [routes, 1])
                    targets = pl.sel(pl.cmps(targets, 0, cmp_type=5), targets,
                                     pl.full([routes, 1], dtype=pl.INT32, value=scratch))
                    copies = pl.mgather(tokens_in, pl.adds(_route_tokens(n, top_k), src * t_max), coalesce="row")
                    recv_rows = pl.scatter_update(recv_rows, 0, targets, copies)
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
                    # slot k of token j is row j * top_k + k; a slot on another rank (-1) gathers zeros
                    routes = n * top_k
                    picked = pl.reshape(rows_in[src * t_max : src * t_max + n, :], [routes, 1])
                    rows = pl.cast(pl.mgather(y, picked, coalesce="row", gather_oob="zero"), pl.FP32)
                    weight = pl.reshape(weights_in[src * t_max : src * t_max + n, :], [routes, 1])
                    weighted = pl.reshape(pl.row_expand_mul(rows, weight), [n, top_k * hidden])
                    total = weighted[:, 0:hidden]
                    for k in pl.range(1, top_k):
                        total = pl.add(total, weighted[:, k * hidden : (k + 1) * hidden])
                    pld.tile.remote_store(pl.cast(total, dtype, mode="rint"), target=back_in, peer=src,
                                          offsets=[me * t_max, 0])
            for peer in pl.range(world):
                pld.system.notify(signals, peer=peer, offsets=[me, COMBINE_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce"):
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, COMBINE_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            total = pl.full([t_dim, hidden], dtype=pl.FP32, value=0.0)
            zeros = pl.full([t_dim, hidden], dtype=pl.FP32, value=0.0)
            for d in pl.range(world):
                goes = pl.cmps(pl.row_expand(zeros, members[:, d : d + 1]), 0.5, cmp_type=4)
                back = pl.add(pl.cast(slots[:, d : d + 1], pl.INT32), d * t_max)
                rows = pl.cast(pl.mgather(back_in, back, coalesce="row", gather_oob="zero"), pl.FP32)
                total = pl.add(total, pl.sel(goes, rows, zeros))
            out[:, :] = pl.cast(total, dtype, mode="rint")
        return out

    return moe_combine
