"""MoE dispatch and combine across ranks as `@pl.jit` kernels on symmetric windows (the `MoEBuffer` protocol).

Sizes: W ranks, E experts (E_LOCAL = E // W per rank, global expert e lives on rank e // E_LOCAL), K routes per
token, T_MAX tokens per rank at most, H hidden, LANES = W * T_MAX. Windows, one per rank, the same layout
everywhere; each source rank s owns a fixed block of every receiver's windows (DeepEP's low-latency layout), so
its counts travel with its payload, in one round:

    counts_in  [W, E + W] INT32   row s: what rank s routes, per global expert (E) and per destination rank
                                  (W: how many of its tokens it sends there)
    tokens_in  [LANES, H]         rows s * T_MAX ..: the tokens rank s sent here, each once, in token order
    meta_in    [LANES, 2K]        FP32, per token: per route slot its row among its sender's rows here (local
                                  expert * LANES + the route's rank among the sender's routes to that expert;
                                  -1 when that route is on another rank), then the slot's combine weight (0 there)
    back_in    [LANES + 1, H]     rows d * T_MAX + slot: rank d's weighted sums for this rank's tokens (combine);
                                  the last row stays zero (no rank writes it): the reduce's dead slots read it
    signals    [W, 2] INT32       column 0 payload, 1 combine; row s: rank s's latest call

The receiver alone knows where a sender's rows go in its layout (expert j's rows from row 0, in (source rank,
token) order): a route's receive row is its meta row plus the rows lower sources send to its expert, from the
count rows that arrived with the payload (`dispatch_parts.shifted_rows`).

Every signal only grows: call i of a buffer sets its cells to i (its *epoch*, kept in the `epoch` tensor and raised
by the dispatch kernel itself; a `NotifyOp.Set`, since a cell has one writer, the rank of its row) and waits until
each cell reaches i, so the windows are never cleared and a late signal of an old call cannot satisfy a newer
wait. Dispatch and combine alternate on a buffer (MoEBuffer checks): a rank writes a peer's windows for call i + 1
only after its combine of call i saw that peer's combine rows, which the peer sends after it read its windows of
call i.

Regions, in program order. Computing regions touch no window; window regions only read or write windows with plain
ops; signalling regions call `pld` ops. A replay runs the first two as recorded torch calls (replay.capture) and a
signalling region as recorded calls of its `pld` ops' effects (replay.comm_block): its row counts, read from
data, are the puts' extents (no `if` on them), so a replay puts that call's live rows.
Dispatch:
1. `moe_route` (computes): routes -> per-expert and per-destination counts (matmuls with 0/1 matrices), each
   route's rank among this rank's rows for its expert and each token's slot among those it sends to each rank
   (exclusive prefix counts: a matmul with a strictly lower triangular matrix); the (token, destination) pairs
   staged by destination (block d * T_MAX): their meta rows in one scatter; their token rows in one scatter of
   every pair or, where every pair's rows are many (`Layout.live_staging`), one gather per destination of the rows
   it takes (`dispatch_parts.stage_live`: live pairs only, their counts read as the exchange reads them);
2. `moe_exchange` (signals): to each destination, the count row and the live rows (tokens and meta) into this
   rank's block, signal 0; then the wait for every source (once each);
3. `moe_arrivals` (windows): per arrival slot (slots past a source's count are masked by a tensor compare, never
   read into the program) and route slot its receive row, kept in the buffer's `routes` tensor for the combine,
   the counts per local expert, and each receive row's arrival slot (an index pass); shapes fixed by the layout in
   both forms, so a replay runs it as torch calls (and the compiled tier compiles it, the live form's too);
4. `moe_expand` (windows): the receive rows. The *fixed* form fills every receive row in one gather (a replay runs
   it as torch calls); the *live* form gathers only each expert's counted rows (`dispatch_live.expand_live`: windows
   whose row counts the call computed, which a replay follows: replay.late_rows).
The form is the layout's (`Layout.fixed_shape`): fixed while all route slots' rows are small (decode sizes) on up
to 4 ranks, where a pass over every slot costs less than the live form; live beyond, where only live rows are
touched.
Combine: `moe_sums` (windows) sums, per arrival slot, its routes' expert rows (the dispatch's `routes`) times their
weights (the weights are applied on the expert's rank, so one row per token and rank travels back). Fixed form: one
gather of every slot's K rows in the data's dtype and one batched matmul, [slots, 1, K] x [slots, K, H], that casts,
weights and sums them in FP32 (a route slot that lives elsewhere weighs 0 and reads a row its token owns, never a
row past the counts, which may hold anything). Live form (`dispatch_live.sums_live`): the same over live routes
only, the slots grouped by their live-route count, one batched matmul per group. `moe_return` (signals) puts each
source's rows back to it, signal 1, and waits for every rank's; `moe_reduce` (windows) gathers, per token, the row
each of its ranks sent back (the zero row for a rank it has no route on) and sums them (the same batched matmul,
weights 0/1) with the token's row of `addend` (e.g. the shared expert's output; zeros when there is none),
rounding once. A live layout built under PYPTO_TIER=eager (compiled at the first replay) combines in two kernels
instead (unless `Layout.live_sums`): `combine_send_kernel` (the sums in the fixed form, whose compiled tier is
one vectorised loop over every route slot, and `moe_return`; its shapes are the layout's, so one specialisation
serves every token count) and `combine_reduce_kernel` (`moe_reduce`). Replayed or on the engine the fixed sums
cost ~2.3x the live ones, so without that tier the live form stays.

Only live rows cross: a put carries exactly the rows a destination needs, plus the [1, E + W] count row (the row
counts are read inside the regions, never by the host program). On the shm communicator, where a rank's block of
tokens_in and back_in is whole pages, the send staging and the sums *are* the peers' blocks (`peer_staging`:
collective.peer_blocks maps every rank's block side by side here), so `moe_route`'s staging and `moe_sums` write the
rows into the destinations and the puts of those rows copy nothing (a put whose source is its target's bytes);
the program is unchanged, and elsewhere the staging is a plain tensor the puts copy from. 8-rank decode T=128
(bench/moe_call_cpu.py, compiled): 5.46 -> 4.56 ms of CPU a call a rank. The host program reads no data, so repeated
calls with the same shapes can replay with any routing."""

import functools
from dataclasses import dataclass

import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt import config
from pypto_rt.collective import process
from pypto_rt.collective.peer_blocks import map_peer_blocks
from pypto_rt.kernels.moe.dispatch_live import expand_live, sums_live
from pypto_rt.kernels.moe.dispatch_parts import (arrived_routes, expand_all, receive_sources, route_layout,
                                                 route_rows, stage_by_destination, sum_returned, weighted_all)
from pypto_rt.kernels.tile_casts import PL_DTYPES

T_DYN = pl.dynamic("T_DYN")
PAYLOAD_SIGNAL, COMBINE_SIGNAL = 0, 1
SIGNALS = 2
FIXED_SHAPE_BYTES = 4 << 20   # a layout whose every route slot's row (LANES * K * H) fits runs the fixed-shape form,
FIXED_SHAPE_MAX_WORLD = 4     # on up to this many ranks
COMPILED_SUMS = "auto"   # a compiled live layout's sums: "every" route slot, "live" routes, "auto" (Layout.live_sums)
LIVE_SUMS_MIN_WORLD, LIVE_SUMS_MIN_ROW_BYTES = 4, 8192   # "auto": the live sums from 4 ranks, on rows of 8 KiB up,
LIVE_SUMS_ANY_ROW_WORLD = 8                               # and from 8 ranks on any row
LIVE_STAGING_BYTES = 1 << 20   # a live layout stages live pairs only when every pair's rows (LANES * H) are this many


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
    def fixed_shape(self) -> bool:
        """Whether the receive side works on every arrival slot (shapes fixed by the layout, so a replay runs it as
        recorded torch calls) rather than on the arrived rows only (fewer bytes; replayed with data-sized windows):
        the fixed form when all route slots' rows are small (decode sizes), as DeepEP's low-latency kernels use
        fixed-size buffers and its normal kernels sized ones, on up to FIXED_SHAPE_MAX_WORLD ranks: a rank holds
        1 / world of the route slots under uniform routing, and at 8 ranks the fixed form's passes over every slot
        cost more than the live form's index work (decode T=8, H=4096, top-6, CPU a call a rank, bench/moe_call_cpu.py:
        compiled 1.72 ms fixed against 1.30 live, replayed 4.9 against 3.6; at 4 ranks compiled 0.80 against 0.77, at
        2 ranks 0.40 against 0.40 compiled and 1.42 against 1.53 replayed)."""
        return (self.world <= FIXED_SHAPE_MAX_WORLD
                and self.lanes * self.top_k * self.hidden * self.dtype.itemsize <= FIXED_SHAPE_BYTES)

    @property
    def live_sums(self) -> bool:
        """Whether a compiled live layout sums its live routes only (`sums_live`) rather than every route slot
        (`combine_send_kernel`): COMPILED_SUMS, or ("auto") from LIVE_SUMS_MIN_WORLD ranks on rows of
        LIVE_SUMS_MIN_ROW_BYTES or more and from LIVE_SUMS_ANY_ROW_WORLD ranks on any. Under uniform routing 1 / world
        of the route slots live on a rank; the pass over every slot is one loop over them all, the live sums a pass
        per live-route count plus index work per arrival slot and route slot that short rows pay back only when few
        slots live. CPU per call (bench/moe_call_cpu.py, compiled, uniform), every slot against live: decode T=128
        (H=4096, top-6) 2.7-3.1 against 3.3 ms at 2 ranks, 5.6 against 5.0-5.5 at 4, 9.0 against 6.3 at 8 (wall
        37.7 against 26.1); prefill T=1024 (H=1024, top-8) 10.3-10.4 against 10.9-11.7 ms at 4 ranks, 17.0-17.6
        against 16.0-16.5 at 8 (wall 71-74 against 67-68; with the groups one compiled segment, their sizes read
        first), and every slot wins at 2 ranks (2-rank prefill 14-16 against 21-22)."""
        if COMPILED_SUMS == "auto":
            return self.world >= LIVE_SUMS_ANY_ROW_WORLD or (
                self.world >= LIVE_SUMS_MIN_WORLD and self.hidden * self.dtype.itemsize >= LIVE_SUMS_MIN_ROW_BYTES)
        return COMPILED_SUMS == "live"

    @property
    def live_staging(self) -> bool:
        """Whether the send staging copies live pairs only (`dispatch_parts.stage_live`: a count read and a gather
        per destination) rather than one scatter of every (token, rank) pair: in the live form, where every pair's
        rows are LIVE_STAGING_BYTES or more. 8-rank decode, CPU a call on rank 0 (bench/moe_call_cpu.py, compiled):
        T=128 (8 MiB of pairs) its segments 3.39-3.42 -> 2.97-3.04 ms; T=8 skewed (512 KiB) 0.82 -> 0.93, the
        per-destination reads and ops costing more than the dead rows they skip."""
        return not self.fixed_shape and self.lanes * self.hidden * self.dtype.itemsize >= LIVE_STAGING_BYTES

    @property
    def pl_dtype(self):
        return PL_DTYPES[self.dtype]


@functools.lru_cache(maxsize=None)
def dispatch_kernel(layout: Layout):
    """The compiled-once window dispatch for one Layout."""
    world, n_experts, top_k, t_max, hidden = (layout.world, layout.num_experts, layout.top_k, layout.max_tokens,
                                              layout.hidden)
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype
    n_counts = n_experts + world
    fixed = layout.fixed_shape

    @pl.jit
    def moe_dispatch(
        x: pl.Tensor[[T_DYN, hidden], dtype],
        topk_idx: pl.Tensor[[T_DYN, top_k], pl.INT32],
        topk_weights: pl.Tensor[[T_DYN, top_k], pl.FP32],
        me: pl.Scalar[pl.INT32],
        epoch: pl.InOut[pl.Tensor[[1, 1], pl.INT32]],
        route_pos: pl.InOut[pl.Tensor[[T_DYN, top_k], pl.FP32]],
        slots: pl.InOut[pl.Tensor[[T_DYN, world], pl.FP32]],
        members: pl.InOut[pl.Tensor[[T_DYN, world], pl.FP32]],
        count_row: pl.InOut[pl.Tensor[[1, n_counts], pl.INT32]],
        send_x: pl.InOut[pl.Tensor[[lanes + 1, hidden], dtype]],
        send_meta: pl.InOut[pl.Tensor[[lanes + 1, 2 * top_k], pl.FP32]],
        recv_rows: pl.InOut[pl.Tensor[[e_local * lanes + 1, hidden], dtype]],
        recv_counts: pl.InOut[pl.Tensor[[1, e_local], pl.INT32]],
        routes: pl.InOut[pl.Tensor[[lanes, top_k], pl.INT32]],
        counts_in: pld.DistributedTensor[[world, n_counts], pl.INT32],
        tokens_in: pld.DistributedTensor[[lanes, hidden], dtype],
        meta_in: pld.DistributedTensor[[lanes, 2 * top_k], pl.FP32],
        signals: pld.DistributedTensor[[world, SIGNALS], pl.INT32],
    ):
        x.bind_dynamic(0, T_DYN)
        topk_idx.bind_dynamic(0, T_DYN)
        topk_weights.bind_dynamic(0, T_DYN)
        route_pos.bind_dynamic(0, T_DYN)
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(x, 0)
        # computing regions touch no window (a replay runs them as recorded torch calls); the signalling one does
        # only what needs the windows' signals
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_route"):
            count_row[:, :] = route_layout(topk_idx, route_pos, slots, members, t_dim, n_experts, world, e_local,
                                           top_k)
            row_ids = route_rows(None, topk_idx, route_pos, t_dim, n_experts, e_local, lanes)
            by_rank = pl.muls(pl.arange(0, [1, world], dtype=pl.INT32), t_max)    # rank d's block: d * T_MAX
            send_x, send_meta = stage_by_destination(x, topk_idx, topk_weights, row_ids, slots, members, by_rank,
                                                     send_x, send_meta, t_dim, world, e_local, top_k, lanes,
                                                     (count_row, t_max, n_experts) if layout.live_staging else None)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_exchange"):
            now = pl.read(epoch, [0, 0]) + 1
            pl.write(epoch, [0, 0], now)
            for d in pl.range(world):
                # the count row and the live rows in one round, into this rank's block of d's windows; the row
                # count is the puts' extent, with no `if` on it: a replay reads it where the run did (0: nothing
                # crosses)
                n = pl.read(count_row, [0, n_experts + d])
                pld.tile.remote_store(count_row, target=counts_in, peer=d, offsets=[me, 0])
                pld.tensor.put(dst=tokens_in, peer=d, src=send_x, dst_offsets=[me * t_max, 0],
                               src_offsets=[d * t_max, 0], shape=[n, hidden])
                pld.tensor.put(dst=meta_in, peer=d, src=send_meta, dst_offsets=[me * t_max, 0],
                               src_offsets=[d * t_max, 0], shape=[n, 2 * top_k])
                pld.system.notify(signals, peer=d, offsets=[me, PAYLOAD_SIGNAL], value=now, op=pld.NotifyOp.Set)
            for src in pl.range(world):
                pld.system.wait(signal=signals, offsets=[src, PAYLOAD_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_arrivals"):   # windows only: replayed as torch calls
            recv_counts[:, :] = pl.col_sum(counts_in[:, me * e_local : (me + 1) * e_local])
            routes[:, :] = arrived_routes(meta_in, counts_in, me, world, t_max, n_experts, e_local, top_k)
            sources = receive_sources(routes, lanes, e_local * lanes, top_k)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_expand"):   # windows only (fixed: replayed as torch calls)
            if fixed:
                recv_rows = expand_all(recv_rows, tokens_in, sources, e_local * lanes)
            else:
                recv_rows = expand_live(recv_rows, tokens_in, sources, recv_counts, e_local, lanes)
        return recv_rows, recv_counts

    return moe_dispatch


@functools.lru_cache(maxsize=None)
def combine_kernel(layout: Layout):
    """The compiled-once window combine for one Layout."""
    world, n_experts, top_k, t_max, hidden = (layout.world, layout.num_experts, layout.top_k, layout.max_tokens,
                                              layout.hidden)
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype
    n_counts = n_experts + world
    fixed = layout.fixed_shape

    @pl.jit
    def moe_combine(
        y: pl.Tensor[[e_local * lanes, hidden], dtype],
        me: pl.Scalar[pl.INT32],
        epoch: pl.Tensor[[1, 1], pl.INT32],
        slots: pl.Tensor[[T_DYN, world], pl.FP32],
        members: pl.Tensor[[T_DYN, world], pl.FP32],
        addend: pl.Tensor[[T_DYN, hidden], dtype],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dtype]],
        sums: pl.InOut[pl.Tensor[[lanes + 1, hidden], dtype]],
        routes: pl.Tensor[[lanes, top_k], pl.INT32],
        counts_in: pld.DistributedTensor[[world, n_counts], pl.INT32],
        meta_in: pld.DistributedTensor[[lanes, 2 * top_k], pl.FP32],
        back_in: pld.DistributedTensor[[lanes + 1, hidden], dtype],
        signals: pld.DistributedTensor[[world, SIGNALS], pl.INT32],
    ):
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        addend.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(out, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_sums"):   # windows only (fixed: replayed as torch calls)
            if fixed:
                sums[0:lanes, :] = pl.cast(weighted_all(y, meta_in, routes, lanes, top_k, hidden), dtype, mode="rint")
            else:
                sums = sums_live(sums, y, meta_in, routes, lanes, top_k, hidden, dtype)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_return"):
            return_sums(sums, me, epoch, counts_in, back_in, signals, world, n_experts, t_max, hidden)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce"):   # windows only: replayed as torch calls
            reduce_returned(out, back_in, slots, members, addend, t_dim, t_max, hidden, world, dtype)
        return out

    return moe_combine


@pl.jit.inline
def return_sums(sums, me, epoch, counts_in, back_in, signals, world, n_experts, t_max, hidden):
    """`moe_return`: each source's sums (its block of `sums`) back to it, as many rows as it sent, signal 1 at the
    call's epoch; then the wait for every rank's."""
    now = pl.read(epoch, [0, 0])
    for src in pl.range(world):
        count = pl.read(counts_in, [src, n_experts + me])
        pld.tensor.put(dst=back_in, peer=src, src=sums, dst_offsets=[me * t_max, 0], src_offsets=[src * t_max, 0],
                       shape=[count, hidden])
        pld.system.notify(signals, peer=src, offsets=[me, COMBINE_SIGNAL], value=now, op=pld.NotifyOp.Set)
    for src in pl.range(world):
        pld.system.wait(signal=signals, offsets=[src, COMBINE_SIGNAL], expected=now, cmp=pld.WaitCmp.Ge)


@functools.lru_cache(maxsize=None)
def combine_send_kernel(layout: Layout):
    """The combine's first half as a kernel of its own, for a live layout run compiled (`WindowTransport`): the
    sums in the fixed form, over every arrival slot (its replay and compiled tier one loop over every route slot's
    row: 40 -> 15.6 ms a 2-rank prefill call when the live form's grouped sums were called as they are; compiled
    too, they still take a 4-rank prefill call from 41-47 to 54 ms), and their return. Every shape is the
    layout's, none the call's token count: one specialisation per layout, compiled once whatever prefill lengths
    follow (`combine_reduce_kernel` takes the rest)."""
    world, n_experts, top_k, t_max, hidden = (layout.world, layout.num_experts, layout.top_k, layout.max_tokens,
                                              layout.hidden)
    e_local, lanes, dtype = layout.local_experts, layout.lanes, layout.pl_dtype

    @pl.jit
    def moe_combine_send(
        y: pl.Tensor[[e_local * lanes, hidden], dtype],
        me: pl.Scalar[pl.INT32],
        epoch: pl.Tensor[[1, 1], pl.INT32],
        sums: pl.InOut[pl.Tensor[[lanes + 1, hidden], dtype]],
        routes: pl.Tensor[[lanes, top_k], pl.INT32],
        counts_in: pld.DistributedTensor[[world, n_experts + world], pl.INT32],
        meta_in: pld.DistributedTensor[[lanes, 2 * top_k], pl.FP32],
        back_in: pld.DistributedTensor[[lanes + 1, hidden], dtype],
        signals: pld.DistributedTensor[[world, SIGNALS], pl.INT32],
    ):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_sums"):   # windows only: replayed as torch calls
            sums[0:lanes, :] = pl.cast(weighted_all(y, meta_in, routes, lanes, top_k, hidden), dtype, mode="rint")
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_return"):
            return_sums(sums, me, epoch, counts_in, back_in, signals, world, n_experts, t_max, hidden)
        return sums

    return moe_combine_send


@functools.lru_cache(maxsize=None)
def combine_reduce_kernel(layout: Layout):
    """The combine's second half after `combine_send_kernel`: per token, the rows its ranks sent back, summed with
    its row of `addend`."""
    world, t_max, hidden, lanes, dtype = layout.world, layout.max_tokens, layout.hidden, layout.lanes, layout.pl_dtype

    @pl.jit
    def moe_combine_reduce(
        slots: pl.Tensor[[T_DYN, world], pl.FP32],
        members: pl.Tensor[[T_DYN, world], pl.FP32],
        addend: pl.Tensor[[T_DYN, hidden], dtype],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dtype]],
        back_in: pld.DistributedTensor[[lanes + 1, hidden], dtype],
    ):
        slots.bind_dynamic(0, T_DYN)
        members.bind_dynamic(0, T_DYN)
        addend.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(out, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_reduce"):   # windows only: replayed as torch calls
            reduce_returned(out, back_in, slots, members, addend, t_dim, t_max, hidden, world, dtype)
        return out

    return moe_combine_reduce


@pl.jit.inline
def reduce_returned(out, back_in, slots, members, addend, t_dim, t_max, hidden, world, dtype):
    """`moe_reduce`: out[t] = the rows t's ranks sent back, summed with addend[t] in FP32, rounded once."""
    by_rank = pl.muls(pl.arange(0, [1, world], dtype=pl.INT32), t_max)
    total = sum_returned(back_in, slots, members, by_rank, world * t_max, t_dim, hidden, world)
    out[:, :] = pl.cast(pl.add(total, pl.cast(addend, pl.FP32)), dtype, mode="rint")


def _window(shape: list[int], dtype):
    return pld.window(pld.alloc_window_buffer(shape, dtype=dtype), shape, dtype=dtype)


def peer_staging(window: torch.Tensor, rank: int, layout: Layout) -> torch.Tensor | None:
    """[LANES + 1, H] rows staged by destination (block d: rows d * T_MAX ..) plus a spill row, for puts into every
    rank's `window` ([LANES, H]) at this rank's block, where block d is rank d's rows of that block itself
    (collective.peer_blocks: a communicator that maps windows here, blocks of whole pages), so the staging writes
    land in the destinations and the puts copy nothing; else (or PYPTO_MOE_PEER_STAGING=0) None. The protocol
    allows the early writes: a rank stages call i + 1's rows only after its combine of call i saw each peer's
    combine rows, which that peer sends after its expand read tokens_in; and it writes its sums into a peer's
    back_in only after that peer's payload signal of the call, sent after its reduce of the call before read it."""
    found = process.window_of(window) if config.MOE_PEER_STAGING.on() else None
    if found is None:
        return None
    row = layout.hidden * layout.dtype.itemsize
    block = layout.max_tokens * row
    mapped = map_peer_blocks(found[0].window, found[1] + rank * block, block, row)
    return None if mapped is None else mapped.view(layout.dtype).view(layout.lanes + 1, layout.hidden)


class WindowTransport:
    """How MoEBuffer's rows cross on a communicator with symmetric windows (shm): the windows above, allocated
    once (COLLECTIVE: every rank, in the same order), the send staging and the epoch that numbers the calls."""

    def __init__(self, layout: Layout, rank: int):
        self.layout, self.rank = layout, rank
        world, lanes, k, hidden = layout.world, layout.lanes, layout.top_k, layout.hidden
        n_counts = layout.num_experts + world
        self._counts_in = _window([world, n_counts], pl.INT32)
        self._tokens_in = _window([lanes, hidden], layout.pl_dtype)
        self._meta_in = _window([lanes, 2 * k], pl.FP32)
        self._back_in = _window([lanes + 1, hidden], layout.pl_dtype)
        self._signals = _window([world, SIGNALS], pl.INT32)
        self._epoch = torch.zeros(1, 1, dtype=torch.int32)
        # staged by destination + a spill row; the sums: per arrival slot (by source), its rows' sum (+ the live
        # sums' spill line); each the peers' window blocks themselves where they map here (peer_staging)
        staged = [peer_staging(window, rank, layout) for window in (self._tokens_in, self._back_in)]
        self.peer_staged = all(s is not None for s in staged)
        self._send_x, self._sums = (torch.zeros(lanes + 1, hidden, dtype=layout.dtype) if s is None else s
                                    for s in staged)
        self._send_meta = torch.zeros(lanes + 1, 2 * k, dtype=torch.float32)
        self._count_row = torch.zeros(1, n_counts, dtype=torch.int32)
        self._routes = torch.zeros(lanes, k, dtype=torch.int32)     # arrival slots' receive rows
        # a live layout compiled at the first replay (PYPTO_TIER=eager) combines in two kernels (unless
        # Layout.live_sums), the fixed-form sums in the first (combine_send_kernel): compiled, one loop;
        # replayed or on the engine 2.3x slower than the live form's (the background tier compiles late, after many
        # calls: those keep the live form)
        self.split_combine = not layout.fixed_shape and config.TIER.get() == "eager" and not layout.live_sums

    def dispatch(self, x, topk_idx, topk_weights, route_pos, slots, members, recv_rows, recv_counts) -> None:
        dispatch_kernel(self.layout)(x, topk_idx, topk_weights, self.rank, self._epoch, route_pos, slots, members,
                                     self._count_row, self._send_x, self._send_meta, recv_rows, recv_counts,
                                     self._routes, self._counts_in, self._tokens_in, self._meta_in, self._signals)

    def combine(self, y, slots, members, addend, out) -> None:
        if not self.split_combine:
            combine_kernel(self.layout)(y, self.rank, self._epoch, slots, members, addend, out, self._sums,
                                        self._routes, self._counts_in, self._meta_in, self._back_in, self._signals)
            return
        combine_send_kernel(self.layout)(y, self.rank, self._epoch, self._sums, self._routes, self._counts_in,
                                         self._meta_in, self._back_in, self._signals)
        combine_reduce_kernel(self.layout)(slots, members, addend, out, self._back_in)

    def sent_rows(self, rank: int) -> list[int]:
        """Token rows `rank`'s latest dispatch sent to each rank."""
        return self._counts_in[rank, self.layout.num_experts:].tolist()

    def signals_untouched(self) -> bool:
        """No call has signalled this rank yet (a check for tests: a refused call sends nothing)."""
        return not self._signals.any() and int(self._epoch) == 0
