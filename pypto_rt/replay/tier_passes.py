"""Passes over the compiled tier's traced graph (aten ops), before inductor: what a tile loop split that a compiler
would not join again.

`join_k_steps`: a K loop of `pl.matmul` / `pl.matmul_acc` traces as one matrix product per K step, summed:
`mm(A[:, k0:k1], B[k0:k1, :]) + mm(A[:, k1:k2], B[k1:k2, :]) + ...`. Inductor calls each product as its own extern
GEMM (and the adds as kernels between them); the golden runs one. The sum of products over adjacent K ranges is the
product over the joined range, so such a chain becomes one `mm` over slices of the same tensors (the casts and
transposes the operands went through kept). Only the summation order changes: floats may differ in their last bits,
as from any reordering inductor does, and the tier checks the result against the replay before the swap.
`join_tiles`: output tiles of one product written apart, joined into one write (bit for bit).
`drop_word_views` and `unroll_narrow_products`: a weighted sum of gathered rows (the MoE combine's) made one
vectorised loop; see each. `rewrite` runs them all, as a build asks, and replay.tier_row_writes' row scatters.
"""
from __future__ import annotations

import torch

from pypto_rt.replay.tier_row_writes import scatter_row_windows

aten = torch.ops.aten


def rewrite(graph: torch.fx.GraphModule, join: bool, reorder: bool = True) -> int:
    """The passes a tier build runs on its traced graph: the word views undone (values bit for bit the same); with
    `reorder`, narrow products unrolled and, with `join` too, K steps and tiles of a matmul joined. Returns how many
    rewrites may change sums in their last bits (where the check against the replay then fails, the build is
    retried without them)."""
    drop_word_views(graph)
    scatter_row_windows(graph)
    if not reorder:
        return 0
    return unroll_narrow_products(graph) + (join_k_steps(graph) + join_tiles(graph) if join else 0)


def join_k_steps(graph: torch.fx.GraphModule) -> int:
    """Join `add(mm, mm)` over adjacent K ranges of the same operands into one `mm`, repeatedly (a whole chain); the
    number of adds joined (the graph is recompiled when any was)."""
    made: dict = {}   # operand description -> the node made for it (one per joined operand, shared)
    joined = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target is not aten.add.Tensor or node.kwargs or len(node.args) != 2:
            continue
        terms = [_term(arg) for arg in node.args]
        if None in terms:
            continue
        term = _joined(*terms) or _joined(*terms[::-1])
        if term is None:
            continue
        with graph.graph.inserting_before(node):
            left, right = (_make(graph.graph, side, made) for side in term)
            product = graph.graph.call_function(aten.mm.default, (left, right))
        joined += _replace(graph, node, product)
    return _recompiled(graph, joined)


def _replace(graph: torch.fx.GraphModule, node, made) -> int:
    """`node`'s uses now use `made`; `node` erased. Returns 1 (one rewrite)."""
    node.replace_all_uses_with(made)
    graph.graph.erase_node(node)
    return 1


def _recompiled(graph: torch.fx.GraphModule, rewrites: int) -> int:
    """`rewrites`, the graph's dead code dropped and its code made again when there were any."""
    if rewrites:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return rewrites


def _term(node):
    """(left operand, right operand) descriptions of `mm(left, right)`, or None."""
    if not isinstance(node, torch.fx.Node) or node.target is not aten.mm.default or node.kwargs:
        return None
    left, right = _operand(node.args[0], k_last=True), _operand(node.args[1], k_last=False)
    return None if left is None or right is None else (left, right)


def _operand(node, k_last: bool):
    """(base node, ((dim, start, end) per base dim), casts, transposed, the base dim K runs along) for an operand
    made of a 2-d tensor by slices, dtype casts, then at most one transpose; else None."""
    transposed = node.target is aten.t.default
    if transposed:
        node = node.args[0]
    casts = []
    while node.target is aten._to_copy.default and set(node.kwargs) == {"dtype"} and len(node.args) == 1:
        casts.append(node.kwargs["dtype"])
        node = node.args[0]
    slices = []
    while node.target is aten.slice.Tensor:
        slices.append(node.args[1:])
        node = node.args[0]
    base = node.meta.get("val")
    if not isinstance(base, torch.Tensor) or base.dim() != 2:
        return None
    ranges = _ranges(slices[::-1], base.shape)
    if ranges is None:
        return None
    k_dim = (0 if transposed else 1) if k_last else (1 if transposed else 0)
    return node, ranges, tuple(casts[::-1]), transposed, k_dim


def _ranges(slices: list, shape) -> tuple | None:
    """((start, end) per dim) of the box `slices` (aten.slice's arguments after the tensor, outermost first) cut
    from a tensor of `shape`; None for a step, a negative or symbolic bound."""
    if not all(type(n) is int for n in shape):
        return None
    ranges = [(0, n) for n in shape]
    for args in slices:
        dim, start, end, step = (*args, *(0, None, None, 1)[len(args):])
        start, end = 0 if start is None else start, ranges[dim][1] if end is None else end
        if step != 1 or not all(type(v) is int and v >= 0 for v in (dim, start, end)):
            return None
        low, high = ranges[dim]
        ranges[dim] = (low + min(start, high - low), low + min(end, high - low))
    return tuple(ranges)


def _joined(first, second):
    """The (left, right) descriptions of `first + second` as one product, when `second`'s K range follows
    `first`'s in both operands and all else is the same; else None."""
    sides = []
    for a, b in zip(first, second):
        (base, ranges, casts, transposed, k), (base2, ranges2, casts2, transposed2, k2) = a, b
        if (base, casts, transposed, k) != (base2, casts2, transposed2, k2) or ranges[k][1] != ranges2[k][0] or \
                any(r != r2 for d, (r, r2) in enumerate(zip(ranges, ranges2)) if d != k):
            return None
        joined = list(ranges)
        joined[k] = (ranges[k][0], ranges2[k][1])
        sides.append((base, tuple(joined), casts, transposed, k))
    return tuple(sides)


def _make(graph: torch.fx.Graph, side, made: dict):
    """The node computing an operand description (made once per description)."""
    key = side[:4]
    node = made.get(key)
    if node is None:
        base, ranges, casts, transposed, _ = side
        node = base
        for dim, (start, end) in enumerate(ranges):
            node = graph.call_function(aten.slice.Tensor, (node, dim, start, end))
        for dtype in casts:
            node = graph.call_function(aten._to_copy.default, (node,), {"dtype": dtype})
        if transposed:
            node = graph.call_function(aten.t.default, (node,))
        made[key] = node
    return node


def join_tiles(graph: torch.fx.GraphModule) -> int:
    """Join the writes of output tiles computed as `copy_(out[box], casts(mm(left, right)))` whose boxes and
    operands follow each other along M or N (and nothing between the two writes changes memory or reads `out`)
    into one write of one product, repeatedly (a whole grid of tiles); the number of writes joined (the graph is
    recompiled when any was). Every output element is the same dot product as before: bit for bit."""
    joined = 0
    while True:
        writes = [n for n in graph.graph.nodes if _tile(n) is not None]
        pair = next(((w1, w2, spec) for w1, w2 in zip(writes, writes[1:])
                     for spec in [_joined_tiles(graph.graph, w1, w2)] if spec is not None), None)
        if pair is None:
            break
        first, second, (out, box, casts, sides) = pair
        made: dict = {}   # (per join: nodes made for another join may come after this one)
        with graph.graph.inserting_before(second):
            value = graph.graph.call_function(aten.mm.default, tuple(_make(graph.graph, s, made) for s in sides))
            for dtype in casts:
                value = graph.graph.call_function(aten._to_copy.default, (value,), {"dtype": dtype})
            graph.graph.call_function(aten.copy_.default, (_make(graph.graph, (out, box, (), False, 0), made),
                                                           value))
        for write in (second, first):
            graph.graph.erase_node(write)
        joined += 1
    return _recompiled(graph, joined)


def _tile(node):
    """(out base, box, casts, (left, right)) of a tile write `copy_(out[box], casts(mm(left, right)))` whose
    product and casts have no other use; else None."""
    if node.op != "call_function" or node.target is not aten.copy_.default or node.kwargs or len(node.args) != 2 \
            or node.users:
        return None
    dest, value = node.args
    casts = []
    while isinstance(value, torch.fx.Node) and value.target is aten._to_copy.default and len(value.users) == 1 \
            and set(value.kwargs) == {"dtype"} and len(value.args) == 1:
        casts.append(value.kwargs["dtype"])
        value = value.args[0]
    if not isinstance(value, torch.fx.Node) or len(value.users) != 1:
        return None
    term, target = _term(value), _operand(dest, k_last=True)
    if term is None or target is None or target[2] or target[3]:
        return None
    return target[0], target[1], tuple(casts[::-1]), term


def _joined_tiles(graph: torch.fx.Graph, first, second):
    """(out base, joined box, casts, (left, right)) of two tile writes that join, else None."""
    a, b = _tile(first), _tile(second)
    if a[0] is not b[0] or a[2] != b[2] or not _quiet_between(graph, first, second, a[0]):
        return None
    (left, right), (left2, right2) = a[3], b[3]
    if any(side[0] is a[0] for side in (left, right, left2, right2)):
        return None   # (an operand read from the tensor written)
    for dim, operands in ((0, _along(left, left2) if right == right2 else None),
                          (1, _along(right, right2) if left == left2 else None)):
        box = _next_box(a[1], b[1], dim)
        if operands is not None and box is not None:
            return a[0], box, a[2], (operands, right) if dim == 0 else (left, operands)
    return None


def _along(first, second):
    """`first` and `second` joined along the product's M (left operand) or N (right operand) dim, else None."""
    base, ranges, casts, transposed, k = first
    if (base, casts, transposed, k) != (second[0], second[2], second[3], second[4]):
        return None
    dim = 1 - k   # (the operand's other dim: M of the left, N of the right)
    box = _next_box(ranges, second[1], dim)
    return None if box is None else (base, box, casts, transposed, k)


def _next_box(box, following, dim: int):
    """The box joining `box` and `following` when `following` comes right after it along `dim`, else None."""
    if box[dim][1] != following[dim][0] or any(r != f for d, (r, f) in enumerate(zip(box, following)) if d != dim):
        return None
    joined = list(box)
    joined[dim] = (box[dim][0], following[dim][1])
    return tuple(joined)


def _quiet_between(graph: torch.fx.Graph, first, second, out) -> bool:
    """Whether every node between the two writes is pure and reads `out` only through slices."""
    views, between = {out}, False
    for node in graph.nodes:
        if node is second:
            return True
        if node is first:
            between = True
            continue
        if between and (node.is_impure() or any(a in views for a in node.all_input_nodes)
                        and node.target is not aten.slice.Tensor):
            return False
        if any(a in views for a in node.all_input_nodes) and node.target is aten.slice.Tensor:
            views.add(node)
    return False


# -------------------------------------------------------------------------------------------- word views undone
_HALF_DTYPES = (torch.bfloat16, torch.float16, torch.int16)


def drop_word_views(graph: torch.fx.GraphModule) -> int:
    """Undo the op library's word views (ops.gather._as_words, ops.comparison._sels_half): eager torch gathers and
    selects 2-byte rows faster as 4-byte words, but inductor ends a fusion at every dtype view, so a gathered row
    that is then selected, cast and summed makes three kernels and two [rows, H] buffers instead of one loop.
    Rewrites, bit for bit the same values:
    - `view(index_select(view(x, W), d, pos), x.dtype)` -> `index_select(x, d, pos)` (d not the last dim);
    - `view(where(m, view(x, W), fill), x.dtype)` (m one per word pair: its last dim 1; fill a 0-d word holding
      the 2-byte value twice, as _sels_half makes it) -> `where(m, x, the fill's first half)`;
    - `view(view(x, W), x.dtype)` -> `x`;
    - `index_copy_(view(x, W), d, pos, view(v, W))` (v of x's dtype, d not the last dim: whole word pairs move)
      -> `index_copy_(x, d, pos, v)`: a row scatter (ops.mscatter's) that a product's result can fuse into.
    Returns how many views were undone (the graph is recompiled when any was)."""
    undone = 0
    for node in list(graph.graph.nodes):
        if node.op == "call_function" and node.target is aten.index_copy_.default:
            undone += _scatter_halves(graph, node)
            continue
        if not _dtype_view(node):
            continue
        inner, dtype = _bare(node.args[0]), node.args[1]
        made = None
        source = _bare(inner.args[0]) if inner.op == "call_function" and inner.args else None
        if _dtype_view(inner) and _dtype_of(source) == dtype:
            made = source
        elif inner.target is aten.index_select.default and _dtype_view(source) \
                and _dtype_of(_bare(source.args[0])) == dtype and _not_last(inner.args[1], inner):
            with graph.graph.inserting_before(node):
                made = graph.graph.call_function(aten.index_select.default, (_bare(source.args[0]), *inner.args[1:]))
        elif inner.target is aten.where.self:
            made = _select_halves(graph.graph, node, inner, dtype)
        if made is not None:
            made.meta.setdefault("val", node.meta.get("val"))
            undone += _replace(graph, node, made)
    return _recompiled(graph, undone)


def _scatter_halves(graph: torch.fx.GraphModule, node) -> int:
    """Rewrite `node` = index_copy_(view(x, W), d, pos, view(v, W)) as index_copy_(x, d, pos, v) (see
    drop_word_views); its uses, if any, take a word view of the result. Returns 1 when rewritten, else 0."""
    if node.kwargs or len(node.args) != 4:
        return 0
    words, dim, positions, values = node.args
    words, values = _bare(words), _bare(values)
    if not (_dtype_view(words) and _dtype_view(values) and _not_last(dim, words)):
        return 0
    target, source = _bare(words.args[0]), _bare(values.args[0])
    if _dtype_of(target) not in _HALF_DTYPES or _dtype_of(source) != _dtype_of(target) \
            or _dtype_of(words) != _dtype_of(values) or _val(words).element_size() != 4:
        return 0
    with graph.graph.inserting_before(node):
        made = graph.graph.call_function(aten.index_copy_.default, (target, dim, positions, source))
        made.meta["val"] = _val(target)
        if node.users:
            as_words = graph.graph.call_function(aten.view.dtype, (made, _dtype_of(words)))
            as_words.meta["val"] = _val(node)
            node.replace_all_uses_with(as_words)
    graph.graph.erase_node(node)
    return 1


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _bare(node):
    """`node` past the detaches tracing puts between a view and its users (same tensor, same values)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.detach.default:
        node = node.args[0]
    return node


def _dtype_view(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.view.dtype \
        and not node.kwargs and len(node.args) == 2 and isinstance(node.args[0], torch.fx.Node)


def _dtype_of(node):
    val = _val(node)
    return val.dtype if isinstance(val, torch.Tensor) else None


def _not_last(dim, node) -> bool:
    val = _val(node)
    return type(dim) is int and isinstance(val, torch.Tensor) and dim % val.dim() != val.dim() - 1


def _select_halves(graph: torch.fx.Graph, node, where, dtype):
    """`where(m, x, half fill)` for `node` = view(where(m, view(x, W), fill), dtype) (or the fill first), else
    None; inserted before `node`."""
    if dtype not in _HALF_DTYPES or where.kwargs or len(where.args) != 3:
        return None
    mask, a, b = where.args
    a, b = _bare(a), _bare(b)
    words, m = _val(where), _val(mask)
    if not isinstance(words, torch.Tensor) or words.element_size() != 4 or not isinstance(m, torch.Tensor) \
            or (m.dim() and m.shape[-1] != 1):   # (a mask along the last dim would split word pairs)
        return None
    for data, fill, data_first in ((a, b, True), (b, a, False)):
        fill_val = _val(fill)
        if _dtype_view(data) and _dtype_of(_bare(data.args[0])) == dtype and isinstance(fill_val, torch.Tensor) \
                and fill_val.dim() == 0 and fill_val.dtype == words.dtype:
            with graph.inserting_before(node):
                pair = graph.call_function(aten.view.dtype, (graph.call_function(aten.view.default, (fill, [1])),
                                                             dtype))
                half = graph.call_function(aten.select.int, (pair, 0, 0))
                half.meta["val"] = fill_val.new_empty((), dtype=dtype)   # (a fake tensor: so is this)
                operands = (_bare(data.args[0]), half) if data_first else (half, _bare(data.args[0]))
                return graph.call_function(aten.where.self, (mask, *operands))
    return None


# ------------------------------------------------------------------------------------ narrow products unrolled
NARROW_WIDTH = 16   # a batched product summing at most this many terms per element is unrolled
UNROLLED_WIDTH = "pypto_rt_unrolled_width"   # graph.meta key: the widest product unrolled (none: absent)
WIDE_ROWS = 64      # ... when its rows are at least this wide
_WIDER = {torch.bfloat16: (torch.float32, torch.float64), torch.float16: (torch.float32, torch.float64),
          torch.float32: (torch.float64,)}   # dtype -> the dtypes it casts to exactly


def unroll_narrow_products(graph: torch.fx.GraphModule) -> int:
    """Write `bmm(a [n, m, w], b [n, w, h])` (FP32) with a narrow w and wide rows h as the sum of its w terms
    `a[:, :, j:j+1] * b[:, j:j+1, :]`, in order: a weighted sum of gathered rows (the MoE combine's) is such a
    product. Inductor decomposes the product itself into a reduction over w, and where w is a multiple of its vector
    width it vectorises along w, loading each of the h columns apart (gathered rows: element by element; an 8-rank
    MoE decode's sum of each token's 8 returned rows took 1.6 ms a call); the sum of terms is one loop over the
    rows' elements, vectorised along h. Summation order may differ from the eager product's in the last bits (the
    tier checks against the replay, with its tolerance). Where b's rows were gathered (`b = view(f(index_select(table,
    0, idx)), [n, w, h])`, f per row), each term gathers its own rows (`_rows_every`): one gathered buffer read by w
    terms is one inductor stores whole (6 MiB for a 64-lane combine) before summing it. Returns how many products
    were unrolled (the graph is recompiled when any was; the widest one's width is kept as
    `graph.meta[UNROLLED_WIDTH]`, for the build's inductor settings: replay.tier_inductor.narrow_settings)."""
    unrolled = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default or node.kwargs:
            continue
        a, b = node.args
        va, vb = _val(a), _val(b)
        if not all(isinstance(v, torch.Tensor) and v.dim() == 3 and v.dtype in (torch.float32, torch.float64)
                   and all(type(n) is int for n in v.shape[1:]) for v in (va, vb)):
            continue   # (the batch may be a symbolic size: a group of rows the call counted, replay.late_rows)
        width, rows = va.shape[2], vb.shape[2]
        if not (2 <= width <= NARROW_WIDTH and rows >= WIDE_ROWS):
            continue
        with graph.graph.inserting_before(node):
            total = None
            for j in range(width):
                term = graph.graph.call_function(aten.mul.Tensor, (
                    graph.graph.call_function(aten.slice.Tensor, (a, 2, j, j + 1)), _term_rows(graph.graph, b, j)))
                total = term if total is None else graph.graph.call_function(aten.add.Tensor, (total, term))
        unrolled += _replace(graph, node, total)
        graph.meta[UNROLLED_WIDTH] = max(width, graph.meta.get(UNROLLED_WIDTH, 0))
    return _recompiled(graph, unrolled)


_CASTS_AND_COPIES = (aten._to_copy.default, aten.detach.default, aten.clone.default, aten.alias.default)
_VIEWS_3D = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _term_rows(graph: torch.fx.Graph, b, j: int):
    """`b[:, j:j+1, :]` of a product's right operand b [n, w, h]: where b is a [n * w, h] tensor viewed as
    [n, w, h] (then cast, copied, expanded to its own shape), the same ops on rows j, j + w, ... of that tensor
    (`_rows_every`; a widening cast made there, before its selects); else a slice of b."""
    n, w, h = _val(b).shape
    node, ops = b, []
    while node.op == "call_function":
        if node.target in _CASTS_AND_COPIES and len(node.args) == 1:
            ops.append(node)
        elif not (node.target in (aten.expand.default, *_VIEWS_3D) and isinstance(node.args[0], torch.fx.Node)
                  and _sizes_equal(_val(node.args[0]).shape, (n, w, h))):   # (an expand or a view to its own shape)
            break
        node = node.args[0]
    source = _val(node.args[0]) if node.op == "call_function" and node.target in _VIEWS_3D else None
    if not isinstance(source, torch.Tensor) or not _sizes_equal(source.shape, (n * w, h)):
        return graph.call_function(aten.slice.Tensor, (b, 1, j, j + 1))
    casts = [op for op in ops if op.target is aten._to_copy.default]
    widen = casts[0].kwargs.get("dtype") if len(casts) == 1 and set(casts[0].kwargs) == {"dtype"} else None
    if widen not in _WIDER.get(source.dtype, ()):
        widen = None
    rows = _rows_every(graph, node.args[0], j, w, widen)
    for op in reversed(ops):   # (the casts and copies, reapplied to the term's rows, but the widening one made)
        if widen is None or op.target is not aten._to_copy.default:
            rows = graph.call_function(op.target, (rows,), dict(op.kwargs))
    return graph.call_function(aten.view.default, (rows, [-1, 1, h]))   # (n rows: n may be symbolic)


def _rows_every(graph: torch.fx.Graph, node, j: int, w: int, widen=None):
    """Rows j, j + w, j + 2w, ... of the 2-d `node` (cast to `widen`, a wider float, when given), made from the
    same rows of its operands where `node` is a row gather (`index_select` along dim 0: its index sliced), a select
    (the cast made on its values, exact: no rounding to the narrow dtype between) or a per-element op of operands
    with one row per row of `node` (or one row, or none: as they are); else a strided slice of `node`."""
    val = _val(node)
    rows = val.shape[0] if isinstance(val, torch.Tensor) and val.dim() == 2 else None

    def cast(x):
        return x if widen is None or not isinstance(x, torch.fx.Node) else \
            graph.call_function(aten._to_copy.default, (x,), {"dtype": widen})
    if rows is not None and node.op == "call_function":
        if node.target is aten.detach.default:
            return _rows_every(graph, node.args[0], j, w, widen)
        if node.target is aten.index_select.default and node.args[1] == 0 and _val(node.args[2]) is not None \
                and _val(node.args[2]).dim() == 1:
            index = graph.call_function(aten.slice.Tensor, (node.args[2], 0, j, _TO_END, w))
            return cast(graph.call_function(aten.index_select.default, (node.args[0], 0, index)))
        if node.target is aten.where.self and not node.kwargs and all(_per_row(a, rows) is not None
                                                                       for a in node.args):
            mask, a, b = node.args
            mask = _rows_every(graph, mask, j, w) if _per_row(mask, rows) else mask
            a, b = (_rows_every(graph, x, j, w, widen) if _per_row(x, rows) else cast(x) for x in (a, b))
            return graph.call_function(aten.where.self, (mask, a, b))
        if node.target in _PER_ELEMENT and all(_per_row(a, rows) is not None for a in node.args):
            args = tuple(_rows_every(graph, a, j, w) if _per_row(a, rows) else a for a in node.args)
            return cast(graph.call_function(node.target, args, dict(node.kwargs)))
    return cast(graph.call_function(aten.slice.Tensor, (node, 0, j, _TO_END, w)))


_PER_ELEMENT = (aten._to_copy.default, aten.mul.Tensor, aten.add.Tensor)


_TO_END = 2**63 - 1   # a slice's end past any size (a symbolic size has no constant to write)


def _sizes_equal(sizes, expected) -> bool:
    """Whether two lists of sizes are equal for every value of their symbolic sizes (a symbolic size is never
    evaluated: that would guard the graph on it)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return len(sizes) == len(expected) and all(
        x == y if type(x) is int and type(y) is int else statically_known_true(x == y)
        for x, y in zip(sizes, expected))


def _per_row(arg, rows):
    """True: `arg` has a row per row (sliced with them); False: a value every row shares (0-d, one row, not a
    tensor); None: neither."""
    if not isinstance(arg, torch.fx.Node):
        return False
    val = _val(arg)
    if not isinstance(val, torch.Tensor):
        return None
    if val.dim() == 0 or (val.dim() == 2 and _sizes_equal(val.shape[:1], (1,))):
        return False
    return True if val.dim() == 2 and _sizes_equal(val.shape[:1], (rows,)) else None
