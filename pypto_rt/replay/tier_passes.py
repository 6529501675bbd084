"""Passes over the compiled tier's traced graph (aten ops), before inductor: what a tile loop split that a compiler
would not join again.

`join_k_steps`: a K loop of `pl.matmul` / `pl.matmul_acc` traces as one matrix product per K step, summed:
`mm(A[:, k0:k1], B[k0:k1, :]) + mm(A[:, k1:k2], B[k1:k2, :]) + ...`. Inductor calls each product as its own extern
GEMM (and the adds as kernels between them); the golden runs one. The sum of products over adjacent K ranges is the
product over the joined range, so such a chain becomes one `mm` over slices of the same tensors (the casts and
transposes the operands went through kept). Only the summation order changes: floats may differ in their last bits,
as from any reordering inductor does, and the tier checks the result against the replay before the swap.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


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
        node.replace_all_uses_with(product)
        graph.graph.erase_node(node)
        joined += 1
    if joined:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return joined


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
    if joined:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return joined


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
