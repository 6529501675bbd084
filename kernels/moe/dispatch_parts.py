"""The `@pl.jit.inline` pieces of MoE dispatch and combine that both transports share (symmetric windows in
`dispatch.py`, collectives in `dispatch_collective.py`): they differ only in how rows cross, not in what the
rows are. Sizes as in `dispatch.py`: W ranks, E experts (E_LOCAL per rank), K routes per token, T tokens,
LANES = W * T_MAX.

The receive layout of a rank: local expert j owns rows j * LANES .., filled from row 0 in (source rank, token)
order. Only the route slots that live on a rank are copied there (compacted with the compare form of
`pl.gather`); the weighted sums are segment sums per token (`weighted_rows`). A sent token row travels with a
[1, 2K] FP32 meta row: per route slot its row in the destination's layout (-1: the route lives elsewhere; rows
below 2^24 are exact in FP32), then the slot's weight (0 there). On windows the sender leaves out the rows lower
ranks take (it never sees their counts), and the receiver adds them (`shifted_rows`).
"""
import pypto.language as pl

SUM_CHUNK = 256   # arrived tokens per weighted-sum pass of the live form (`sums_by_chunk`)
PREFIX_BLOCK = 128   # rows per block of `exclusive_prefix` past it (prefill's T): [B, B] triangles, not one [T, T]


@pl.jit.inline
def prefix_matrix(n):
    """[n, n] FP32 with 1 where column < row: `matmul(prefix, m)` counts, per row, the ones above it in m. One
    `pl.tri` (below the diagonal), not index tiles compared and selected: 6 passes over [n, n] at prefill's n."""
    return pl.tri(-1, [n, n], dtype=pl.FP32)


@pl.jit.inline
def exclusive_prefix(m, n, width):
    """[n, width] FP32: per row, the sum of m's rows above it (m [n, width] FP32 counts: exact below 2^24). Up to
    PREFIX_BLOCK rows (decode) one matmul by `prefix_matrix(n)`; past it, when blocks divide n, blocked: the prefix
    within each block of PREFIX_BLOCK rows (one batched matmul by its triangle), plus the sums of the blocks above
    (a [blocks, blocks] prefix of the block totals): n / PREFIX_BLOCK times fewer multiplies than the [n, n] one."""
    if n <= PREFIX_BLOCK or n % PREFIX_BLOCK != 0:
        return pl.matmul(prefix_matrix(n), m)
    blocks = n // PREFIX_BLOCK
    parts = pl.reshape(m, [blocks, PREFIX_BLOCK, width])
    within = pl.matmul(prefix_matrix(PREFIX_BLOCK), parts)                           # [blocks, B, width]
    totals = pl.matmul(pl.full([1, PREFIX_BLOCK], dtype=pl.FP32, value=1.0), parts)  # [blocks, 1, width]
    above = pl.matmul(prefix_matrix(blocks), pl.reshape(totals, [blocks, width]))
    return pl.reshape(pl.add(within, pl.reshape(above, [blocks, 1, width])), [n, width])


@pl.jit.inline
def repeat_rows(n, times):
    """[n * times, 1] INT32: row i * times + j holds i."""
    rows = pl.reshape(pl.arange(0, [1, n], dtype=pl.INT32), [n, 1])
    return pl.reshape(pl.row_expand(pl.full([n, times], dtype=pl.INT32, value=0), rows), [n * times, 1])


@pl.jit.inline
def spread_row(row, n, times):
    """[1, times] INT32 `row` -> [n * times, 1]: row i * times + j holds row[0, j]."""
    return pl.reshape(pl.col_expand(pl.full([n, times], dtype=pl.INT32, value=0), row), [n * times, 1])


@pl.jit.inline
def k_major(block, n, times):
    """[n, times] -> [times * n, 1]: row j * n + i holds block[i, j] (a [times * n, H] gather then sums over j
    as one column sum of its [times, n * H] reshape)."""
    return pl.reshape(pl.transpose(block, 0, 1), [times * n, 1])


@pl.jit.inline
def rank_blocks(n_experts, world, e_local):
    """[E, W] FP32 with 1 where expert e lives on rank d (d * e_local <= e < (d + 1) * e_local)."""
    experts = pl.row_expand(pl.full([n_experts, world], dtype=pl.INT32, value=0),
                            pl.reshape(pl.arange(0, [1, n_experts], dtype=pl.INT32), [n_experts, 1]))
    first = pl.col_expand(pl.full([n_experts, world], dtype=pl.INT32, value=0),
                          pl.muls(pl.arange(0, [1, world], dtype=pl.INT32), e_local))
    inside = pl.and_(pl.cmp(experts, first, cmp_type=5), pl.cmp(experts, pl.adds(first, e_local), cmp_type=2))
    return pl.sel(inside, pl.full([n_experts, world], dtype=pl.FP32, value=1.0),
                  pl.full([n_experts, world], dtype=pl.FP32, value=0.0))


@pl.jit.inline
def route_layout(topk_idx, route_pos, slots, members, t_dim, n_experts, world, e_local, top_k):
    """This rank's routes, counted (matmuls with 0/1 matrices): route_pos [T, K] each route's rank among this
    rank's routes to its expert, members [T, W] 1 where a token has a route on rank d, slots [T, W] its place
    among the tokens sent to d. Returns the [1, E + W] INT32 count row: routes per global expert, then tokens
    per destination rank."""
    hits = pl.cmp(pl.reshape(topk_idx, [t_dim * top_k, 1]), pl.arange(0, [1, n_experts], dtype=pl.INT32),
                  cmp_type=0)                                                      # [T * K, E] 0/1 per route
    routed = pl.reshape(pl.matmul(pl.full([t_dim, 1, top_k], dtype=pl.FP32, value=1.0),
                                  pl.cast(pl.reshape(hits, [t_dim, top_k, n_experts]), pl.FP32, mode="rint")),
                        [t_dim, n_experts])                                        # [T, E] 0/1 (ids are distinct)
    route_pos[:, :] = pl.gather(exclusive_prefix(routed, t_dim, n_experts), dim=-1,
                                index=topk_idx)                                    # top-k experts are distinct
    goes = pl.mins(pl.matmul(routed, rank_blocks(n_experts, world, e_local)), 1.0)
    members[:, :] = goes
    slots[:, :] = exclusive_prefix(goes, t_dim, world)
    counts = pl.full([1, n_experts + world], dtype=pl.FP32, value=0.0)
    counts[:, 0:n_experts] = pl.col_sum(routed)
    counts[:, n_experts : n_experts + world] = pl.col_sum(goes)
    return pl.cast(counts, pl.INT32, mode="trunc")


@pl.jit.inline
def lower_ranks_take(all_counts, me, world):
    """[1, E + W] FP32: the sums of the count rows of ranks below `me` (all_counts [W, E + W] INT32): where this
    rank's rows start in each expert's receive rows, and its tokens in each destination's arrivals."""
    below = pl.sel(pl.cmps(pl.arange(0, [1, world], dtype=pl.INT32), me, cmp_type=2),
                   pl.full([1, world], dtype=pl.FP32, value=1.0), pl.full([1, world], dtype=pl.FP32, value=0.0))
    return pl.matmul(below, pl.cast(all_counts, pl.FP32, mode="rint"))


@pl.jit.inline
def route_rows(taken, topk_idx, route_pos, t_dim, n_experts, e_local, lanes):
    """[T, K] FP32: each route's row in its destination's receive layout (local expert * LANES + the rows lower
    ranks take there + the route's rank among this rank's); `taken` None: the rows lower ranks take are left to the
    receiver (`shifted_rows`), which alone knows them when the counts travel with the payload."""
    local = pl.cast(pl.muls(pl.rems(pl.arange(0, [1, n_experts], dtype=pl.INT32), e_local), lanes), pl.FP32,
                    mode="rint")
    if taken is not None:
        local = pl.add(taken[:, 0:n_experts], local)
    base = pl.col_expand(pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0), local)
    return pl.add(pl.gather(base, dim=-1, index=topk_idx), route_pos)


@pl.jit.inline
def shifted_rows(rows, base, lanes):
    """[m, K] INT32: sender rows `rows` ([m, K] INT32: local expert * LANES + the route's rank among its sender's
    routes there; -1: elsewhere) moved past the rows lower ranks take, `base` ([m, E_LOCAL] FP32: per line, the
    rows its sender's lower ranks send to each local expert); -1 stays."""
    expert = pl.divs(pl.maxs(rows, 0), lanes)
    shift = pl.cast(pl.gather(base, dim=-1, index=expert), pl.INT32, mode="trunc")
    return pl.sel(pl.cmps(rows, 0, cmp_type=5), pl.add(rows, shift), rows)


@pl.jit.inline
def lower_sources(arrived, me, world, e_local):
    """[W, E_LOCAL] FP32: per source rank, the rows lower sources send to each of this rank's experts (arrived
    [W, E + W] FP32: every source's count row)."""
    return pl.matmul(prefix_matrix(world), arrived[:, me * e_local : (me + 1) * e_local])


@pl.jit.inline
def source_rows(meta, base, s, n, t_max, lanes, top_k, e_local):
    """[n, K] INT32: the receive rows of the n tokens source `s` sent (its block of meta from row s * T_MAX;
    base [W, E_LOCAL] from `lower_sources`), -1 where a route lives elsewhere."""
    rows = pl.cast(meta[s * t_max : s * t_max + n, 0:top_k], pl.INT32, mode="trunc")
    return shifted_rows(rows, pl.col_expand(pl.full([n, e_local], dtype=pl.FP32, value=0.0), base[s : s + 1, :]),
                        lanes)


@pl.jit.inline
def stage_by_destination(x, topk_idx, topk_weights, row_ids, slots, members, first_row, send_x, send_meta, t_dim,
                         world, e_local, top_k, spill, live_counts=None):
    """Stage one row per (token, destination rank) in send_x, with its meta row in send_meta: destination d's
    tokens at first_row[0, d] + their slot ([1, W] INT32), in token order; the pairs that do not go land on row
    `spill`. `live_counts` (count_row, T_MAX, E) where first_row is d * T_MAX: the token rows copied for live pairs
    only (`stage_live`), else one row scatter of every pair. Returns (send_x, send_meta)."""
    pairs = t_dim * world
    pair_token = repeat_rows(t_dim, world)                     # pair row t * W + d
    pair_experts = pl.mgather(topk_idx, pair_token, coalesce="row")
    first = pl.row_expand(pair_experts, pl.muls(spread_row(pl.arange(0, [1, world], dtype=pl.INT32), t_dim, world),
                                                e_local))
    there = pl.and_(pl.cmp(pair_experts, first, cmp_type=5), pl.cmp(pair_experts, pl.adds(first, e_local), cmp_type=2))
    meta = pl.full([pairs, 2 * top_k], dtype=pl.FP32, value=0.0)
    meta[:, 0:top_k] = pl.sel(there, pl.mgather(row_ids, pair_token, coalesce="row"),
                              pl.full([pairs, top_k], dtype=pl.FP32, value=-1.0))
    meta[:, top_k : 2 * top_k] = pl.sel(there, pl.mgather(topk_weights, pair_token, coalesce="row"),
                                        pl.full([pairs, top_k], dtype=pl.FP32, value=0.0))
    staged = pl.add(pl.reshape(pl.cast(slots, pl.INT32, mode="trunc"), [pairs, 1]), spread_row(first_row, t_dim, world))
    staged = pl.sel(pl.cmps(pl.reshape(members, [pairs, 1]), 0.5, cmp_type=4), staged,
                    pl.full([pairs, 1], dtype=pl.INT32, value=spill))
    # live pairs' rows are distinct; only the spill row is written more than once (any survivor: it never crosses),
    # so no last-writer pass (a sort and a gather of every staged row per call)
    if live_counts is None:
        send_x = pl.mscatter(pl.mgather(x, pair_token, coalesce="row"), staged, send_x, coalesce="row",
                             scatter_conflict="default")
    else:
        send_x = stage_live(x, pair_token, staged, live_counts[0], send_x, world, live_counts[1], spill,
                            live_counts[2])
    send_meta = pl.mscatter(meta, staged, send_meta, coalesce="row", scatter_conflict="default")
    return send_x, send_meta


@pl.jit.inline
def stage_live(x, pair_token, staged, count_row, send_x, world, t_max, lanes, n_experts):
    """The token rows of `stage_by_destination` for blocks of T_MAX rows per destination (its `first_row` d * T_MAX),
    copying live pairs only: each staging row's token (one index scatter of the pairs, the dead ones to the spill
    row), then per destination one gather of as many rows as it takes (count_row [1, E + W] INT32, read with no
    `if`: a replay's rows follow it, 0 an empty gather). Every row is read and written once; the pair scatter copied
    a row per (token, rank), the dead ones onto the spill row (8-rank decode T=128: ~1024 rows against ~560).
    Returns send_x."""
    token_of = pl.mscatter(pair_token, staged, pl.full([lanes + 1, 1], dtype=pl.INT32, value=0), coalesce="row",
                           scatter_conflict="default")
    return gather_counted(send_x, x, token_of, count_row, n_experts, world, t_max)


@pl.jit.inline
def gather_counted(out, table, index, counts, first_count, blocks, block_rows):
    """Per block j of `block_rows` rows, its first counts[0, first_count + j] rows of `out` gathered from `table`
    at the same rows of `index` ([blocks * block_rows (+ any), 1] INT32). Each count is read with no `if` on it: a
    replay's rows follow it (replay.late_rows), 0 an empty gather. Returns out."""
    for j in pl.range(blocks):
        c = pl.read(counts, [0, first_count + j])
        out[j * block_rows : j * block_rows + c, :] = pl.mgather(table, index[j * block_rows : j * block_rows + c, :],
                                                                 coalesce="row")
    return out


@pl.jit.inline
def live_routes(rows, n, top_k):
    """The route slots of the n arrived tokens (their rows [n, K] INT32, -1 elsewhere) that live on this rank,
    compacted: (slots [1, n * K] INT32 whose first m entries are the live slots' positions in route-slot-major
    order (slot k of token j at k * n + j), m). Its rows, weights and tokens are then gathered at those positions."""
    rows = pl.reshape(k_major(rows, n, top_k), [1, n * top_k])
    slots, count = pl.gather(rows, kvalue=0, cmp_mode=5, out_cols=n * top_k)      # slots whose row is >= 0
    return slots, pl.read(count, [0, 0])


@pl.jit.inline
def at_live(block, slots, n, m, top_k):
    """[m, 1]: the entries of `block` [n, K] at the first m live slots (route-slot-major positions)."""
    row = pl.reshape(k_major(block, n, top_k), [1, n * top_k])
    return pl.reshape(pl.gather(row, dim=-1, index=slots[:, 0:m]), [m, 1])


@pl.jit.inline
def expand_arrived(recv_rows, tokens, rows, n, top_k):
    """Copy each of the n arrived tokens (rows 0..n of `tokens`; `rows` [n, K] INT32 their route slots' receive
    rows, -1 elsewhere) into the rows of its route slots that live here: one gather and one scatter over the live
    slots only. Returns recv_rows."""
    slots, m = live_routes(rows, n, top_k)
    if m > 0:
        targets = at_live(rows, slots, n, m, top_k)
        token_of = pl.row_expand(pl.full([n, top_k], dtype=pl.INT32, value=0),
                                 pl.reshape(pl.arange(0, [1, n], dtype=pl.INT32), [n, 1]))
        copies = pl.mgather(tokens, at_live(token_of, slots, n, m, top_k), coalesce="row")
        # the live targets are distinct: no last-writer pass
        recv_rows = pl.mscatter(copies, targets, recv_rows, coalesce="row", scatter_conflict="default")
    return recv_rows


@pl.jit.inline
def sums_by_chunk(sums, first, y, meta, rows, n, top_k, hidden, dtype):
    """sums[first + i]: per arrived token i, the sum over its route slots here of its expert row in y
    ([E_local * LANES, H]) times the slot's weight, in the sums' dtype (meta [n, 2K] its meta rows, rows [n, K]
    INT32 its route slots' receive rows, -1 elsewhere). A segment sum per token: one gather of its K slots' rows,
    stood in and zeroed where a slot lives elsewhere, and one batched matmul (`live_weighted_rows`: an inf row behind
    a dead slot gives inf, not 0 * inf = NaN), SUM_CHUNK tokens at a time:
    the [chunk, K, H] FP32 the matmul casts stays 8 MiB (heap memory a call reuses, in cache) where all n at
    once (32 MiB at 1024 tokens, top-8, H=1024) took a fresh mapping per call and 3-4x the CPU. The weights are
    computed once for all n (fewer op calls per pass). Returns sums."""
    weights = pl.sel(pl.cmps(rows, 0, cmp_type=5), meta[:, top_k : 2 * top_k],
                     pl.full([n, top_k], dtype=pl.FP32, value=0.0))
    for c0 in pl.range(0, n, SUM_CHUNK):
        c = pl.min(SUM_CHUNK, n - c0)
        sums[first + c0 : first + c0 + c, :] = pl.cast(
            live_weighted_rows(y, rows[c0 : c0 + c, :], weights[c0 : c0 + c, :], c, top_k, hidden), dtype,
            mode="rint")
    return sums


@pl.jit.inline
def stand_in_rows(rows, n, width):
    """[n, width] INT32 rows (-1: none) with each -1 replaced by a real row of the same line (its largest; 0 when
    the line has none): a gather then reads only rows the line owns, and their weight 0 keeps them out of the sum
    (rows nobody owns may hold anything, NaN included, and 0 * NaN is NaN)."""
    fallback = pl.row_expand(pl.full([n, width], dtype=pl.INT32, value=0), pl.maxs(pl.row_max(rows), 0))
    return pl.sel(pl.cmps(rows, 0, cmp_type=5), rows, fallback)


@pl.jit.inline
def weighted_rows(table, rows, weights, n, width, hidden):
    """[n, H] FP32: per line i, sum_j weights[i, j] * table[rows[i, j]] (rows [n, width] INT32 in range, weights
    [n, width] FP32): one gather of n * width rows in the table's dtype and one batched matmul, [n, 1, width] x
    [n, width, H], that casts, weights and sums them in FP32."""
    picked = pl.reshape(pl.mgather(table, pl.reshape(rows, [n * width, 1]), coalesce="row"), [n, width, hidden])
    return pl.reshape(pl.matmul(pl.reshape(weights, [n, 1, width]), picked), [n, hidden])


@pl.jit.inline
def live_weighted_rows(table, rows, weights, n, width, hidden):
    """[n, H] FP32: per line i, sum_j weights[i, j] * table[rows[i, j]] over its live slots (rows [n, width] INT32,
    -1: dead). A dead slot reads a stand-in row (`stand_in_rows`) that a select then zeroes, so a row that is +inf or
    NaN meets no 0 weight (0 * inf is NaN); the select fuses into the gather when compiled."""
    live = pl.reshape(pl.cmps(rows, 0, cmp_type=5), [n * width, 1])
    picked = pl.mgather(table, pl.reshape(stand_in_rows(rows, n, width), [n * width, 1]), coalesce="row")
    picked = pl.reshape(pl.sels(live, picked, scalar=0.0), [n, width, hidden])
    return pl.reshape(pl.matmul(pl.reshape(weights, [n, 1, width]), picked), [n, hidden])


@pl.jit.inline
def sum_returned(back, slots, members, first_row, zero_row, t_dim, hidden, world):
    """[T, H] FP32: per token, the sum of the rows the ranks of its routes sent back; rank d's rows start at
    first_row[0, d] ([1, W] INT32) and hold its tokens in slot order. A rank the token has no route on reads row
    `zero_row` of `back`, which holds zeros (no rank writes it), so the sum needs no select and no stand-in row:
    one gather and one batched matmul with the members as weights. The reduce's compiled kernel, 8-rank decode
    T=128 (H=4096), alone on a core: 0.53-0.59 -> 0.32-0.33 ms a call against a stand-in row per dead slot and a
    select (the same bits)."""
    rows = pl.add(pl.cast(slots, pl.INT32, mode="trunc"),
                  pl.col_expand(pl.full([t_dim, world], dtype=pl.INT32, value=0), first_row))
    rows = pl.sel(pl.cmps(members, 0.5, cmp_type=4), rows, pl.full([t_dim, world], dtype=pl.INT32, value=zero_row))
    return weighted_rows(back, rows, members, t_dim, world, hidden)


# ------------------------------------------------------------------ fixed-shape forms (small layouts, replayed)
@pl.jit.inline
def arrived_routes(meta, counts, me, world, t_max, n_experts, e_local, top_k):
    """[LANES, K] INT32: per arrival slot (source s's block from row s * T_MAX) and route slot its row in this
    rank's receive layout, -1 where the route lives elsewhere or no token arrived in that slot this call (slots
    past a source's count, from `counts` [W, E + W] INT32, hold an older call's rows: windows are never cleared).
    The dispatch keeps them for its combine (the same windows until the next dispatch)."""
    lanes = world * t_max
    source = repeat_rows(world, t_max)                                     # [LANES, 1]: slot l's source
    sent = pl.mgather(counts[:, n_experts + me : n_experts + me + 1], source, coalesce="row")   # its tokens here
    token = pl.rems(pl.reshape(pl.arange(0, [1, lanes], dtype=pl.INT32), [lanes, 1]), t_max)
    arrived = pl.cmp(token, sent, cmp_type=2)                              # [LANES, 1]: the slot holds a token
    base = lower_sources(pl.cast(counts, pl.FP32, mode="rint"), me, world, e_local)
    rows = shifted_rows(pl.cast(meta[:, 0:top_k], pl.INT32, mode="trunc"),
                        pl.mgather(base, source, coalesce="row"), lanes)
    return pl.sel(arrived, rows, pl.full([lanes, top_k], dtype=pl.INT32, value=-1))


@pl.jit.inline
def receive_sources(routes, lanes, layout_rows, top_k):
    """[layout_rows + 1, 1] INT32: per receive row the arrival slot whose token it holds (routes [LANES, K] INT32
    from `arrived_routes`, -1: dead; rows no route fills hold 0, the last row takes the dead slots). One row scatter
    whose only repeated target is that last row, so no last-writer pass (`scatter_conflict="default"`: a sort of
    every target when replayed)."""
    target = pl.sel(pl.cmps(routes, 0, cmp_type=5), routes,
                    pl.full([lanes, top_k], dtype=pl.INT32, value=layout_rows))
    token = pl.row_expand(pl.full([lanes, top_k], dtype=pl.INT32, value=0),
                          pl.reshape(pl.arange(0, [1, lanes], dtype=pl.INT32), [lanes, 1]))
    return pl.mscatter(k_major(token, lanes, top_k), k_major(target, lanes, top_k),
                       pl.full([layout_rows + 1, 1], dtype=pl.INT32, value=0), coalesce="row",
                       scatter_conflict="default")


@pl.jit.inline
def expand_all(recv_rows, tokens, sources, layout_rows):
    """The fixed-shape form of `expand_arrived`: every receive row gathered at once from its arrival slot
    (`sources` from `receive_sources`; rows no route fills get slot 0's row: they are past their expert's count,
    with no zeroing pass). Returns recv_rows."""
    recv_rows[0:layout_rows, :] = pl.mgather(tokens, sources[0:layout_rows, :], coalesce="row")
    return recv_rows


@pl.jit.inline
def weighted_all(y, meta, rows, lanes, top_k, hidden):
    """The fixed-shape form of `sums_by_chunk`, over every arrival slot (`rows`: the dispatch's `arrived_routes`):
    [LANES, H] FP32 (rows of dead slots hold anything: no one reads them). Slots that do not live here weigh 0
    (their stale weights: any bits) and add 0 (`live_weighted_rows`)."""
    weights = pl.sel(pl.cmps(rows, 0, cmp_type=5), meta[:, top_k : 2 * top_k],
                     pl.full([lanes, top_k], dtype=pl.FP32, value=0.0))
    return live_weighted_rows(y, rows, weights, lanes, top_k, hidden)
