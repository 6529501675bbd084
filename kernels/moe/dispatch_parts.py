"""The `@pl.jit.inline` pieces of MoE dispatch and combine that both transports share (symmetric windows in
`dispatch.py`, collectives in `dispatch_collective.py`): they differ only in how rows cross, not in what the
rows are. Sizes as in `dispatch.py`: W ranks, E experts (E_LOCAL per rank), K routes per token, T tokens.

The receive layout of a rank: local expert j owns rows j * LANES .. (LANES = W * T_MAX), filled from row 0 in
(source rank, token) order; one scratch row past the layout takes the copies of routes that live elsewhere.
"""
import pypto.language as pl


@pl.jit.inline
def prefix_matrix(n):
    """[n, n] FP32 with 1 where column < row: `matmul(prefix, m)` counts, per row, the ones above it in m."""
    rows = pl.row_expand(pl.full([n, n], dtype=pl.INT32, value=0),
                         pl.reshape(pl.arange(0, [1, n], dtype=pl.INT32), [n, 1]))
    cols = pl.col_expand(pl.full([n, n], dtype=pl.INT32, value=0), pl.arange(0, [1, n], dtype=pl.INT32))
    return pl.sel(pl.cmp(cols, rows, cmp_type=2), pl.full([n, n], dtype=pl.FP32, value=1.0),
                  pl.full([n, n], dtype=pl.FP32, value=0.0))


@pl.jit.inline
def route_layout(topk_idx, route_pos, slots, members, t_dim, n_experts, world, e_local):
    """This rank's routes, counted: route_pos [T, K] each route's rank among this rank's routes to its expert,
    members [T, W] 1 where a token has a route on rank d, slots [T, W] its place among the tokens sent to d.
    Returns the [1, E + W] INT32 count row: routes per global expert, then tokens per destination rank."""
    experts = pl.col_expand(pl.full([t_dim, n_experts], dtype=pl.INT32, value=0),
                            pl.arange(0, [1, n_experts], dtype=pl.INT32))
    ones = pl.full([t_dim, n_experts], dtype=pl.FP32, value=1.0)
    zeros = pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0)
    routed = pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0)
    for k in pl.range(pl.tensor.dim(topk_idx, 1)):
        hit = pl.cmp(experts, pl.row_expand(experts, topk_idx[:, k : k + 1]), cmp_type=0)
        routed = pl.add(routed, pl.sel(hit, ones, zeros))
    prefix = prefix_matrix(t_dim)
    # a route's rank among this rank's rows for its expert (top-k experts of a token are distinct)
    route_pos[:, :] = pl.gather(pl.matmul(prefix, routed), dim=-1, index=topk_idx)
    goes = pl.full([t_dim, world], dtype=pl.FP32, value=0.0)
    for d in pl.range(world):
        goes[:, d : d + 1] = pl.row_max(routed[:, d * e_local : (d + 1) * e_local])
    members[:, :] = goes
    slots[:, :] = pl.matmul(prefix, goes)
    counts = pl.full([1, n_experts + world], dtype=pl.FP32, value=0.0)
    counts[:, 0:n_experts] = pl.col_sum(routed)
    counts[:, n_experts : n_experts + world] = pl.col_sum(goes)
    return pl.cast(counts, pl.INT32)


@pl.jit.inline
def route_rows(expert_counts, me, topk_idx, route_pos, t_dim, world, e_local, lanes):
    """[T, K] INT32: each route's row in its expert's rank's receive layout, from expert_counts [W, E] FP32 (every
    rank's routes per expert): the local expert's block, plus the rows lower ranks take in it, plus route_pos."""
    n_experts = world * e_local
    lower = pl.cmps(pl.arange(0, [1, world], dtype=pl.INT32), me, cmp_type=2)
    before = pl.sel(lower, pl.full([1, world], dtype=pl.FP32, value=1.0),
                    pl.full([1, world], dtype=pl.FP32, value=0.0))
    offsets = pl.matmul(before, expert_counts)            # [1, E]: rows lower ranks take per expert
    base = pl.full([1, n_experts], dtype=pl.FP32, value=0.0)
    local = pl.mul(pl.cast(pl.arange(0, [1, e_local], dtype=pl.INT32), pl.FP32), float(lanes))
    for d in pl.range(world):
        base[:, d * e_local : (d + 1) * e_local] = pl.add(offsets[:, d * e_local : (d + 1) * e_local], local)
    rows = pl.add(pl.gather(pl.col_expand(pl.full([t_dim, n_experts], dtype=pl.FP32, value=0.0), base),
                            dim=-1, index=topk_idx), route_pos)
    return pl.cast(rows, pl.INT32)


@pl.jit.inline
def destination_block(x, topk_idx, topk_weights, row_ids, slots, members, d, n, e_local, t_max):
    """The n tokens this rank sends rank d, each once and in token order: (their x rows [n, H], their routes'
    rows there [n, K] (-1 for a route on another rank), the routes' weights [n, K] (0 for those))."""
    t_dim = pl.tensor.dim(x, 0)
    top_k = pl.tensor.dim(topk_idx, 1)
    there = pl.and_(pl.cmps(topk_idx, d * e_local, cmp_type=5), pl.cmps(topk_idx, (d + 1) * e_local, cmp_type=2))
    slot = pl.cast(slots[:, d : d + 1], pl.INT32)
    goes = pl.cmps(members[:, d : d + 1], 0.5, cmp_type=4)
    token_ids = pl.reshape(pl.arange(0, [1, t_dim], dtype=pl.INT32), [t_dim, 1])
    order = pl.full([t_max + 1, 1], dtype=pl.INT32, value=0)   # row t_max takes the tokens that stay away
    order = pl.scatter_update(order, 0, pl.sel(goes, slot, pl.full([t_dim, 1], dtype=pl.INT32, value=t_max)),
                              token_ids)
    picked = order[0:n, :]
    rows = pl.sel(there, row_ids, pl.full([t_dim, top_k], dtype=pl.INT32, value=-1))
    weights = pl.sel(there, topk_weights, pl.full([t_dim, top_k], dtype=pl.FP32, value=0.0))
    return (pl.mgather(x, picked, coalesce="row"), pl.mgather(rows, picked, coalesce="row"),
            pl.mgather(weights, picked, coalesce="row"))


@pl.jit.inline
def expand_rows(recv_rows, arrived, targets, n, scratch):
    """Copy each of the n arrived tokens into the receive rows of its routes (targets [n, K] INT32; a route's -1
    lands on the scratch row). Returns recv_rows."""
    for k in pl.range(pl.tensor.dim(targets, 1)):
        target = targets[:, k : k + 1]
        target = pl.sel(pl.cmps(target, 0, cmp_type=5), target, pl.full([n, 1], dtype=pl.INT32, value=scratch))
        recv_rows = pl.scatter_update(recv_rows, 0, target, arrived)
    return recv_rows


@pl.jit.inline
def weighted_routes(y, rows, weights, n, hidden):
    """[n, H] FP32: per received token, the sum over its routes of y[row] * weight (a row of -1 adds 0)."""
    total = pl.full([n, hidden], dtype=pl.FP32, value=0.0)
    for k in pl.range(pl.tensor.dim(rows, 1)):
        picked = pl.mgather(y, rows[:, k : k + 1], coalesce="row", gather_oob="zero")
        total = pl.add(total, pl.row_expand_mul(pl.cast(picked, pl.FP32), weights[:, k : k + 1]))
    return total


@pl.jit.inline
def sum_returned(back, slots, members, bases, t_dim, hidden, world):
    """[T, H] FP32: per token, the sum of the rows that came back from the ranks its routes went to; rank d's
    row for token t is back[bases[0, d] + slots[t, d]] (bases: [1, W] FP32, a tensor: no scalar read)."""
    total = pl.full([t_dim, hidden], dtype=pl.FP32, value=0.0)
    zeros = pl.full([t_dim, hidden], dtype=pl.FP32, value=0.0)
    for d in pl.range(world):
        goes = pl.cmps(pl.row_expand(zeros, members[:, d : d + 1]), 0.5, cmp_type=4)
        base = pl.col_expand(pl.full([t_dim, 1], dtype=pl.FP32, value=0.0), bases[:, d : d + 1])
        at = pl.cast(pl.add(slots[:, d : d + 1], base), pl.INT32)
        rows = pl.cast(pl.mgather(back, at, coalesce="row", gather_oob="zero"), pl.FP32)
        total = pl.add(total, pl.sel(goes, rows, zeros))
    return total
