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
