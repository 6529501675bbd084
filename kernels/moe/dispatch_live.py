"""The live form of the window receive side (layouts past `dispatch.FIXED_SHAPE_BYTES`, prefill sizes, and every
layout from 8 ranks: `Layout.fixed_shape`): the same index passes as the fixed form (`dispatch_parts.arrived_routes`,
over every arrival slot, shapes fixed by the layout), then data-sized row passes that touch live rows only. Sizes as
in `dispatch.py`. Their row counts are read from data the call computed and used with no `if` on them (0 rows: an
empty gather), so a replay's windows follow each call's counts (replay.late_rows) and both passes replay as torch
calls. A replay reads all of a pass's counts before its first row op (replay.passes moves each read up to the
one before it), so the pass's torch calls are one run: one compiled segment, one copy of its inputs for the tier's
check.

Dispatch (`expand_live`): every receive row's arrival slot (one index scatter), then per local expert one gather of
its `recv_counts` rows from the arrived tokens: each live route row is read and written once, and no row is
scattered (a row scatter costs torch 2-3x a gather).

Combine (`sums_live`): each arrival slot's sum over its live routes only. There is no scatter-add in the DSL (nor
in the real compiler's tile ops), so the segment sum is made regular instead: the slots are grouped by how many
of their routes live here (c = 1..K), each slot's live routes packed to its first c columns, and each group summed
as one [m, 1, c] x [m, c, H] batched matmul over exactly its live rows, in FP32 and rounded once, plus GROUP_PAD
spill lines (weight 0, into a spill row of the sums): a compiled replay's segment holds for the line counts it was
traced with, 0 and 1 each their own, so no group has fewer than GROUP_PAD lines (an 8-rank skewed call after a
uniform warm-up ran its groups replayed: 122-180 ms against 100). Dead route slots are never gathered, cast or
multiplied (the fixed form stands in a live row with weight 0 for them: at 2 ranks and top-8 half the slots, at 4
three quarters).
"""
import pypto.language as pl

from pypto_rt.kernels.moe.dispatch_parts import gather_counted, weighted_rows

GROUP_PAD = 2   # spill lines added to every live-route group: no group is 0 or 1 lines (each its own compiled graph)

@pl.jit.inline
def expand_live(recv_rows, tokens, sources, recv_counts, e_local, lanes):
    """Fill each local expert's first recv_counts[0, j] receive rows with their tokens (tokens [LANES, H]: the
    arrival slots; `sources` from `dispatch_parts.receive_sources`), one gather per expert. Returns recv_rows."""
    return gather_counted(recv_rows, tokens, sources, recv_counts, 0, e_local, lanes)


@pl.jit.inline
def packed_routes(routes, weights, top_k):
    """Each arrival slot's live routes packed to its first columns, in route-slot order: (rows [LANES, K] INT32,
    weights [LANES, K] FP32, live [1, LANES] INT32: how many; columns past it hold any route's). One compare-form
    `pl.gather` finds each line's live route slots (a per-line compaction), two index gathers move them."""
    picks, live = pl.gather(routes, kvalue=0, cmp_mode=5, out_cols=top_k)     # route slots whose row is >= 0
    return pl.gather(routes, dim=-1, index=picks), pl.gather(weights, dim=-1, index=picks), live


@pl.jit.inline
def slots_by_count(live, lanes, top_k):
    """(slots [LANES + GROUP_PAD + 1, K] INT32, sizes [1, K] INT32): column c - 1 lists, ascending, the arrival
    slots with exactly c live routes (live [1, LANES] INT32), its first sizes[0, c - 1] entries, then the spill
    line LANES (one past the arrival slots) to the end."""
    per_count = pl.col_expand(pl.full([top_k, lanes], dtype=pl.INT32, value=0), live)
    wanted = pl.reshape(pl.arange(1, [1, top_k], dtype=pl.INT32), [top_k, 1])
    rows = lanes + GROUP_PAD + 1
    slots, sizes = pl.gather(pl.row_expand_sub(per_count, wanted), kvalue=0, cmp_mode=0, out_cols=rows)
    line = pl.row_expand(pl.full([rows, top_k], dtype=pl.INT32, value=0),
                         pl.reshape(pl.arange(0, [1, rows], dtype=pl.INT32), [rows, 1]))
    counted = pl.cmp(line, pl.col_expand(pl.full([rows, top_k], dtype=pl.INT32, value=0), sizes), cmp_type=2)
    return pl.sel(counted, pl.transpose(slots, 0, 1), pl.full([rows, top_k], dtype=pl.INT32, value=lanes)), sizes


@pl.jit.inline
def sums_live(sums, y, meta, routes, lanes, top_k, hidden, dtype):
    """sums[l]: per arrival slot l, the sum over its live routes of its expert row in y ([E_local * LANES, H]) times
    the route's weight (meta [LANES, 2K]: the weights after the rows), in the sums' dtype (sums [LANES + 1, H]: the
    last row is the spill line); slots with no live route (none arrived there) are left as they are. One batched
    matmul per live-route count, over that group's slots and GROUP_PAD spill lines (their number read from data
    the call computed, with no `if` on it: a replay's rows follow it; never fewer than GROUP_PAD, so a compiled
    replay built on any call holds for every count). Returns sums."""
    rows, weights, live = packed_routes(routes, meta[:, top_k : 2 * top_k], top_k)
    spill_rows = pl.full([lanes + 1, top_k], dtype=pl.INT32, value=0)     # the spill line reads row 0, weight 0
    spill_rows[0:lanes, :] = rows
    spill_weights = pl.full([lanes + 1, top_k], dtype=pl.FP32, value=0.0)
    spill_weights[0:lanes, :] = weights
    by_slot, sizes = slots_by_count(live, lanes, top_k)   # group c's slots in rows 0..m of column c - 1
    for c in pl.range(1, top_k + 1):
        m = pl.read(sizes, [0, c - 1]) + GROUP_PAD
        group = by_slot[0:m, c - 1 : c]
        group_rows = pl.mgather(spill_rows, group, coalesce="row")
        group_weights = pl.mgather(spill_weights, group, coalesce="row")
        part = weighted_rows(y, group_rows[:, 0:c], group_weights[:, 0:c], m, c, hidden)
        sums = pl.mscatter(pl.cast(part, dtype, mode="rint"), group, sums, coalesce="row",
                           scatter_conflict="default")   # distinct slots but the spill line's: no last-writer pass
    return sums
