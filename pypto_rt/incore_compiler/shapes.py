"""Static shape inference for the tile values of an InCore body, as expressions over the body's inputs.

A shape is a list of AST expressions (one per dimension) or None when not statically known. The
only consumer is access analysis: a `pl.assemble(t, src, offs)` writes the box `offs` + shape(src),
so the task graph can let sibling tasks writing disjoint tiles of one tensor run in parallel.
Unknown shapes are safe: they only widen the region a task is said to touch.
"""
from __future__ import annotations

import ast

from pypto_rt.frontend.resolve import Env, callee, op_name
from pypto_rt.ops.opdef import Shape, opdef


def base_op(qualname: str | None) -> str | None:
    """`tile.add` -> `add`: namespaces share semantics for shape purposes."""
    return qualname.rsplit(".", 1)[-1] if qualname else None


def arg(call: ast.Call, pos: int, kw: str):
    found = next((k.value for k in call.keywords if k.arg == kw), None)
    if found is None and len(call.args) > pos:
        found = call.args[pos]
    return found


class ShapeInference:
    """Shapes of the names bound in a body; a name bound with two different shapes has none."""

    def __init__(self, env: Env, body):
        self.env = env
        self.shapes: dict[str, list | None] = {}
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self._bind(node.targets[0].id, self.of(node.value))

    def _bind(self, name: str, shape):
        if name in self.shapes and not _same(self.shapes[name], shape):
            self.shapes[name] = None
        else:
            self.shapes[name] = shape

    def of(self, node) -> list | None:
        if isinstance(node, ast.Name):
            return self.shapes.get(node.id)
        if isinstance(node, ast.Subscript):
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            box = subscript_box(node)
            return box[1] if box and all(isinstance(i, ast.Slice) for i in items) else None
        if not isinstance(node, ast.Call):
            return None
        d = opdef(op_name(callee(self.env, node)))
        rule = d.shape if d is not None else Shape.OTHER
        if rule is Shape.FROM_ARG:
            literal = arg(node, *d.shape_arg)
            return list(literal.elts) if isinstance(literal, (ast.List, ast.Tuple)) else None
        first = self.of(node.args[0]) if node.args else None
        if rule is Shape.SAME:
            return first or next((s for s in map(self.of, node.args[1:]) if s), None)
        if rule is Shape.ROW_REDUCE and first and len(first) == 2:
            return [first[0], ast.Constant(1)]
        if rule is Shape.COL_REDUCE and first and len(first) == 2:
            return [ast.Constant(1), first[1]]
        if rule is Shape.FIRST:
            return first
        if rule is Shape.MATMUL:
            return self._matmul(node, first)
        return None

    def _matmul(self, node, first):
        rhs = self.of(arg(node, 1, "rhs"))
        if not first or not rhs or len(first) != 2 or len(rhs) != 2:
            return None
        a_trans, b_trans = (_true(arg(node, 99, k)) for k in ("a_trans", "b_trans"))
        return [first[1] if a_trans else first[0], rhs[0] if b_trans else rhs[1]]


def subscript_box(node: ast.Subscript):
    """(offsets, sizes) of `t[a:b, c]` as expressions (None = unknown / whole dim), or None if not a box."""
    index = node.slice
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    offsets, sizes = [], []
    for item in items:
        if isinstance(item, ast.Slice):
            if item.step is not None:
                return None
            lower = item.lower or ast.Constant(0)
            offsets.append(lower)
            sizes.append(None if item.upper is None else _difference(item.upper, lower))
        elif isinstance(item, ast.Constant) and item.value is Ellipsis:
            return None
        else:
            offsets.append(item)
            sizes.append(ast.Constant(1))
    return offsets, sizes


def _difference(upper, lower):
    """`upper - lower`, simplified for the `t[r : r + T]` idiom to `T`."""
    if isinstance(upper, ast.BinOp) and isinstance(upper.op, ast.Add) and _dump(upper.left) == _dump(lower):
        return upper.right
    return ast.BinOp(upper, ast.Sub(), lower)


def _true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(_dump(x) == _dump(y) for x, y in zip(a, b))


def _dump(node) -> str | None:
    return None if node is None else ast.dump(node)
