"""MoE dispatch and combine across ranks as `@pl.jit` kernels on symmetric windows (the `MoEBuffer` protocol).

Sizes: W ranks, E experts (E_LOCAL = E // W per rank, global expert e lives on rank e // E_LOCAL), K routes per
token, T_MAX tokens per rank at most, H hidden, LANES = W * T_MAX. Windows, one per rank, the same layout
everywhere:

    counts_in  [W, E + W] INT32   row s: what rank s routes, per global expert (E) and per destination rank
                                  (W: how many of its tokens it sends there); the counts travel first
    tokens_in  [LANES, H]         the tokens sent here, each once, packed from row 0 in source-rank order
    rows_in    [LANES, K]         INT32, per token and route slot: its row in this rank's receive layout (local
                                  expert * LANES + offset), or -1 when that route is on another rank
    weights_in [LANES, K]         FP32, the route's combine weight (0 where rows_in is -1)
    back_in    [LANES, H]         rows d * T_MAX + slot: rank d's weighted sums for this rank's tokens (combine)
    signals    [W, 3] INT32       column 0 counts, 1 payload, 2 combine; row s counts rank s's notifications

Every signal only grows: call i of a buffer waits until each cell reaches i (its *epoch*, kept in the `epoch`
tensor and raised by the dispatch kernel itself), so the windows are never cleared and a late signal of an old
call cannot satisfy a newer wait. Dispatch and combine alternate on a buffer (MoEBuffer checks): a rank writes
a peer's windows for call i + 1 only after its combine of call i saw that peer's combine rows, which the peer
sends after it read its windows of call i.

Dispatch (three communication regions, in program order):
1. `moe_layout`: routes -> per-expert and per-destination counts (matmuls with 0/1 matrices), each route's rank
   among this rank's rows for its expert and each token's slot among those it sends to each rank (exclusive
   prefix counts: a matmul with a strictly lower triangular matrix); the count row goes to every rank, then
   signal 0;
2. `moe_send`: once every rank's counts arrived, the sum of lower ranks' counts gives, per expert, where this
   rank's rows start in the receiver's layout and, per destination, where its tokens start in that rank's
   tokens_in; the (token, destination) pairs are staged by destination in one scatter each for the rows, their
   route rows and weights, and each destination gets its live rows in one store; then signal 1;
3. `moe_receive`: once every payload arrived, every arrived token is copied to the rows of its routes here in
   one gather and one scatter (a route on another rank lands on a spill row past the layout), and the counts per
   local expert are summed.
Combine (two regions): `moe_return` sums, per arrived token, its routes' expert rows times their weights (the
weights are applied on the expert's rank, so one row per token and rank travels back; a gather in route-slot
major order makes the sum over slots one column sum) and stores each source's rows to it, then signal 2;
`moe_reduce` gathers, per token, the row each of its ranks sent back and sums them with the token's row of
`addend` (e.g. the shared expert's output; zeros when there is none), rounding once.

Only live rows cross: a store carries exactly the rows a destination needs (the row counts are read inside the
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
def _repeat_rows(n, times):
    """[n * times, 1] INT32: row i * times + j holds i."""
    rows = pl.reshape(pl.arange(0, [1, n], dtype=pl.INT32), [n, 1])
    return pl.reshape(pl.row_expand(pl.full([n, times], dtype=pl.INT32, value=0), rows), [n * times, 1])


@pl.jit.inline
def _cycle_rows(n, times):
    """[n * times, 1] INT32: row i * times + j holds j."""
    cols = pl.arange(0, [1, times], dtype=pl.INT32)
    return pl.reshape(pl.col_expand(pl.full([n, times], dtype=pl.INT32, value=0), cols), [n * times, 1])


@pl.jit.inline
def _rank_blocks(n_experts, world, e_local):
    """[E, W] FP32 with 1 where expert e lives on rank d (d * e_local <= e < (d + 1) * e_local)."""
    experts = pl.row_expand(pl.full([n_experts, world], dtype=pl.INT32, value=0),
                            pl.reshape(pl.arange(0, [1, n_experts], dtype=pl.INT32), [n_experts, 1]))
    first = pl.col_expand(pl.full([n_experts, world], dtype=pl.INT32, value=0),
                          pl.muls(pl.arange(0, [1, world], dtype=pl.INT32), e_local))
    inside = pl.and_(pl.cmp(experts, first, cmp_type=5), pl.cmp(experts, pl.adds(first, e_local), cmp_type=2))
    return pl.sel(inside, pl.full([n_experts, world], dtype=pl.FP32, value=1.0),
                  pl.full([n_experts, world], dtype=pl.FP32, value=0.0))


@pl.jit.inline
def _k_major(block, n, top_k):
    """[n, K] -> [K * n, 1]: row k * n + j holds block[j, k] (so a [K * n, H] gather sums over k as K blocks)."""
    return pl.reshape(pl.transpose(block, 0, 1), [top_k * n, 1])


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
        send_x: pl.InOut[pl.Tensor[[lanes + 1, hidden], dtype]],
        send_rows: pl.InOut[pl.Tensor[[lanes + 1, top_k], pl.INT32]],
        send_weights: pl.InOut[pl.Tensor[[lanes + 1, top_k], pl.FP32]],
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
            routed = pl.scatter(pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0), dim=-1, index=topk_idx,
                                src=pl.full([t_dim, top_k], dtype=pl.FP32, value=1.0))     # [T, E] 0/1
            prefix = _prefix_matrix(t_dim)
            # a route's rank among this rank's rows for its expert (a token's top-k experts are distinct)
            route_pos[:, :] = pl.gather(pl.matmul(prefix, routed), dim=-1, index=topk_idx)
            goes = pl.mins(pl.matmul(routed, _rank_blocks(n_experts, world, e_local)), 1.0)   # [T, W] 0/1
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
            lower = pl.cmps(pl.arange(0, [1, world], dtype=pl.INT32), me, cmp_type=2)
            before = pl.sel(lower, pl.full([1, world], dtype=pl.FP32, value=1.0),
                            pl.full([1, world], dtype=pl.FP32, value=0.0))
            # what lower ranks take: rows of each expert [:, :E], token rows in each destination [:, E:]
            taken = pl.matmul(before, pl.cast(pl.load(counts_in, [0, 0], [world, n_counts]), pl.FP32))
            experts = pl.arange(0, [1, n_experts], dtype=pl.INT32)
            local = pl.cast(pl.muls(pl.rems(experts, e_local), lanes), pl.FP32)
            base = pl.add(taken[:, 0:n_experts], local)
            row_ids = pl.cast(pl.add(pl.gather(pl.col_expand(pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0),
                                                             base), dim=-1, index=topk_idx), route_pos), pl.INT32)
            # one send row per (token, destination rank), row t * W + d; its routes that are on rank d
            pair_token = _repeat_rows(t_dim, world)
            pair_rank = _cycle_rows(t_dim, world)
            pair_experts = pl.mgather(topk_idx, pair_token, coalesce="row")
            first = pl.row_expand(pair_experts, pl.muls(pair_rank, e_local))
            there = pl.and_(pl.cmp(pair_experts, first, cmp_type=5),
                            pl.cmp(pair_experts, pl.adds(first, e_local), cmp_type=2))
            pairs = t_dim * world
            rows_there = pl.sel(there, pl.mgather(row_ids, pair_token, coalesce="row"),
                                pl.full([pairs, top_k], dtype=pl.INT32, value=-1))
            weights_there = pl.sel(there, pl.mgather(topk_weights, pair_token, coalesce="row"),
                                   pl.full([pairs, top_k], dtype=pl.FP32, value=0.0))
            # staged by destination: rank d's rows at d * T_MAX + slot; pairs that do not go land past them
            staged = pl.add(pl.reshape(pl.cast(slots, pl.INT32), [pairs, 1]), pl.muls(pair_rank, t_max))
            goes = pl.cmps(pl.reshape(members, [pairs, 1]), 0.5, cmp_type=4)
            staged = pl.sel(goes, staged, pl.full([pairs, 1], dtype=pl.INT32, value=lanes))
            send_x = pl.scatter_update(send_x, 0, staged, pl.mgather(x, pair_token, coalesce="row"))
            send_rows = pl.scatter_update(send_rows, 0, staged, rows_there)
            send_weights = pl.scatter_update(send_weights, 0, staged, weights_there)
            at = pl.cast(taken, pl.INT32)
            for d in pl.range(world):
                n = pl.read(counts_in, [me, n_experts + d])
                if n > 0:
                    row = pl.read(at, [0, n_experts + d])    # after the token rows of lower ranks
                    pld.tile.remote_store(send_x[d * t_max : d * t_max + n, :], target=tokens_in, peer=d,
                                          offsets=[row, 0])
                    pld.tile.remote_store(send_rows[d * t_max : d * t_max + n, :], target=rows_in, peer=d,
                                          offsets=[row, 0])
                    pld.tile.remote_store(send_weights[d * t_max : d * t_max + n, :], target=weights_in, peer=d,
                                          offsets=[row, 0])
            for peer in pl.range(world):
                pld.system.notify(signals, peer=peer, offsets=[me, PAYLOAD_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_receive"):
            me = pld.rank(pld.get_comm_ctx(signals))
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, PAYLOAD_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            arrived = pl.cast(pl.load(counts_in, [0, 0], [world, n_counts]), pl.FP32)
            recv_counts[:, :] = pl.cast(pl.col_sum(arrived[:, me * e_local : (me + 1) * e_local]), pl.INT32)
            n = pl.read(pl.cast(pl.col_sum(arrived[:, n_experts + me : n_experts + me + 1]), pl.INT32), [0, 0])
            if n > 0:
                # every arrived token once per route slot (row j * K + k); slots on other ranks (-1) land past
                # the layout
                routes = n * top_k
                targets = pl.reshape(rows_in[0:n, :], [routes, 1])
                targets = pl.sel(pl.cmps(targets, 0, cmp_type=5), targets,
                                 pl.full([routes, 1], dtype=pl.INT32, value=e_local * lanes))
                copies = pl.mgather(tokens_in, _repeat_rows(n, top_k), coalesce="row")
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
        addend: pl.Tensor[[T_DYN, hidden], dtype],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dtype]],
        counts_in: pld.DistributedTensor[[world, n_counts], pl.INT32],
        rows_in: pld.DistributedTensor[[lanes, top_k], pl.INT32],
        weights_in: pld.DistributedTensor[[lanes, top_k], pl.FP32],
        back_in: pld.DistributedTensor[[lanes, hidden], dtype],
        signals: pld.DistributedTensor[[world, SIGNALS], pl.INT32],
    ):
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        addend.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(out, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_return"):
            me = pld.rank(pld.get_comm_ctx(signals))
            arrived = pl.cast(pl.load(counts_in, [0, n_experts + me], [world, 1]), pl.FP32)
            n = pl.read(pl.cast(pl.col_sum(arrived), pl.INT32), [0, 0])
            if n > 0:
                # per arrived token: the sum of its routes' expert rows on this rank times their weights (a route
                # on another rank, -1, gathers zeros); one row per token goes back to its rank
                rows = pl.cast(pl.mgather(y, _k_major(rows_in[0:n, :], n, top_k), coalesce="row",
                                          gather_oob="zero"), pl.FP32)
                weighted = pl.row_expand_mul(rows, _k_major(weights_in[0:n, :], n, top_k))
                sums = pl.cast(pl.reshape(pl.col_sum(pl.reshape(weighted, [top_k, n * hidden])), [n, hidden]),
                               dtype, mode="rint")
                starts = pl.cast(pl.matmul(_prefix_matrix(world), arrived), pl.INT32)   # [W, 1] first row per source
                for src in pl.range(world):
                    count = pl.read(counts_in, [src, n_experts + me])
                    if count > 0:
                        first = pl.read(starts, [src, 0])
                        pld.tile.remote_store(sums[first : first + count, :], target=back_in, peer=src,
                                              offsets=[me * t_max, 0])
            for peer in pl.range(world):
                pld.system.notify(signals, peer=peer, offsets=[me, COMBINE_SIGNAL], value=1,
                                  op=pld.NotifyOp.AtomicAdd)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce"):
            now = pl.read(epoch, [0, 0])
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, COMBINE_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
            # token t's row from rank d is row d * T_MAX + its slot there; ranks it did not go to gather zeros
            back = pl.add(pl.cast(slots, pl.INT32), pl.col_expand(pl.full([t_dim, world], dtype=pl.INT32, value=0),
                                                                  pl.muls(pl.arange(0, [1, world], dtype=pl.INT32),
                                                                          t_max)))
            back = pl.sel(pl.cmps(members, 0.5, cmp_type=4), back,
                          pl.full([t_dim, world], dtype=pl.INT32, value=-1))
            rows = pl.cast(pl.mgather(back_in, _k_major(back, t_dim, world), coalesce="row", gather_oob="zero"),
                           pl.FP32)
            total = pl.reshape(pl.col_sum(pl.reshape(rows, [world, t_dim * hidden])), [t_dim, hidden])
            out[:, :] = pl.cast(pl.add(total, pl.cast(addend, pl.FP32)), dtype, mode="rint")
        return out

    return moe_combine
