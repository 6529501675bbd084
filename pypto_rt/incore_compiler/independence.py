"""Whether a tiled loop body keeps its tiled dimension independent, so `k` iterations can run as one wide task.

The check coalescing (coalesce.py) runs for each candidate dimension: every use of the loop variable and of the
tile step is a tile offset / extent along that dimension, every op keeps the dimension independent (its OpDef's
`coalesce` dims), and values broadcast against tiled values have extent 1 (or the step) along it.
"""
from __future__ import annotations

import ast

from pypto_rt.frontend.names import stored_names
from pypto_rt.frontend.resolve import UNRESOLVED, Env, callee, is_loop, op_name
from pypto_rt.incore_compiler.shapes import ShapeInference, arg, base_op
from pypto_rt.ops.opdef import opdef

_PY_BUILTINS = {"int", "float", "min", "max", "len", "range", "abs", "bool"}


class TiledDimCheck:
    """Every use of the loop variable and of the step is a tile offset/extent along `dim`; every op keeps that
    dimension independent; the tiled operand of a matmul is on the tiled side."""

    def __init__(self, env: Env, var: str, step: ast.expr, dim: int, body, context=None):
        """`context`: the code around `body` (a whole kernel), whose names' shapes it may use."""
        self.env, self.var, self.dim = env, var, dim
        self.shapes = ShapeInference(env, context if context is not None else body)
        self.step = ast.dump(step)
        self.covered: set[int] = set()
        self.tiled: set[str] = set()     # names holding values tiled along `dim`
        self.untiled: set[str] = set()   # inputs combined with tiled values: must have extent 1 along `dim`
        self.local = stored_names(body)

    def accepts(self, body) -> bool:
        module = ast.Module(body=body, type_ignores=[])
        try:
            for node in ast.walk(module):
                self._visit(node)
            self._settle_tiled(module)
            for node in ast.walk(module):
                d = opdef(op_name(callee(self.env, node))) if isinstance(node, ast.Call) else None
                if d is not None and d.broadcasts:
                    self._operands(node, d.non_operands)
        except _Reject:
            return False
        uses = [n for n in ast.walk(module) if self._is_var(n) or self._is_step(n)]
        return all(id(n) in self.covered for n in uses)

    def _settle_tiled(self, module) -> None:
        """`tiled` to a fixpoint: the walk above meets assignments breadth-first, not in program order."""
        assigns = [n for n in ast.walk(module) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                   and n.value is not None]
        while True:
            grown = {name for n in assigns if self._mentions_tiled(n.value)
                     for name in stored_names(n.targets if isinstance(n, ast.Assign) else [n.target])}
            if grown <= self.tiled:
                return
            self.tiled |= grown

    def _operands(self, node: ast.Call, non_operands) -> None:
        """An op mixing tiled values with an untiled tensor broadcasts that tensor against one tile; merged
        tiles would meet it at another extent. Allowed: scalars, extent 1 along `dim`, an extent that is the step
        itself (rewritten with the tiles), and inputs the host checks when it runs the loop (`untiled`)."""
        operands = list(node.args) + [k.value for k in node.keywords if k.arg not in non_operands]
        if not any(self._mentions_tiled(o) for o in operands):
            return
        for o in operands:
            if self._mentions_tiled(o) or self._is_scalar(o):
                continue
            shape = self.shapes.of(o)
            extent = None
            if shape is not None:
                extent = shape[self.dim] if len(shape) == 2 else ast.Constant(1) if len(shape) == 1 and \
                    self.dim == 0 else None
            if extent is not None:
                if self._is_step(extent) or (isinstance(extent, ast.Constant) and extent.value == 1):
                    continue
                raise _Reject
            base = o.value if isinstance(o, ast.Subscript) else o
            if (isinstance(base, ast.Name) and base.id not in self.local and self.env.lookup(base.id) is UNRESOLVED
                    and (o is base or self._whole_along_dim(o))):
                self.untiled.add(base.id)   # a kernel input (all of it along `dim`): the host looks at its shape
                continue
            raise _Reject

    def _whole_along_dim(self, sub: ast.Subscript) -> bool:
        items = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
        if len(items) <= self.dim:
            return True
        item = items[self.dim]
        return (isinstance(item, ast.Slice) and item.upper is None and item.step is None
                and (item.lower is None or (isinstance(item.lower, ast.Constant) and item.lower.value == 0)))

    def _is_scalar(self, node) -> bool:
        """A number known before the kernel runs: literals, module constants, arithmetic of those."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float, bool))
        if isinstance(node, (ast.Name, ast.Attribute)) and not (isinstance(node, ast.Name) and node.id in self.local):
            value = self.env.resolve(node)
            return isinstance(value, (int, float, bool))
        if isinstance(node, ast.BinOp):
            return self._is_scalar(node.left) and self._is_scalar(node.right)
        if isinstance(node, ast.UnaryOp):
            return self._is_scalar(node.operand)
        return False

    def _is_var(self, node) -> bool:
        return isinstance(node, ast.Name) and node.id == self.var

    def _is_step(self, node) -> bool:
        return isinstance(node, ast.expr) and ast.dump(node) == self.step

    def _mentions_tiled(self, node) -> bool:
        return any(self._is_var(n) or (isinstance(n, ast.Name) and n.id in self.tiled) for n in ast.walk(node))

    def _visit(self, node):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = stored_names(targets)
            if self.var in bound:
                raise _Reject
            if node.value is not None and self._mentions_tiled(node.value):
                self.tiled |= bound
        elif isinstance(node, ast.Subscript):
            self._subscript(node)
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Lambda, ast.FunctionDef)):
            raise _Reject

    def _subscript(self, node: ast.Subscript):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if not any(self._is_var(n) for n in ast.walk(node.slice)):
            return
        if len(items) <= self.dim:
            raise _Reject
        item = items[self.dim]
        if not (isinstance(item, ast.Slice) and item.step is None and self._is_var(item.lower)
                and isinstance(item.upper, ast.BinOp) and isinstance(item.upper.op, ast.Add)
                and self._is_var(item.upper.left) and self._is_step(item.upper.right)):
            raise _Reject
        self.covered |= {id(item.lower), id(item.upper.left), id(item.upper.right)}

    def _call(self, node: ast.Call):
        target = callee(self.env, node)
        if is_loop(target) or getattr(target, "__name__", None) in _PY_BUILTINS and not op_name(target):
            return
        d, op = opdef(op_name(target)), base_op(op_name(target))
        if d is None or self.dim not in d.coalesce:
            raise _Reject
        if d.shape_arg is not None:
            self._shape(arg(node, *d.shape_arg), op)
        valid = next((k.value for k in node.keywords if k.arg == "valid_shape"), None)
        if valid is not None:
            self._shape(valid, op)
        if d.offset_arg is not None and self._offsets(arg(node, *d.offset_arg)):
            self._tile_extent(node, d, op, valid)
        if op in ("matmul", "matmul_acc"):
            self._matmul(node, op)

    def _shape(self, literal, op):
        """A tile shape: the extent along `dim` may be the step; [1, step] / [step, 1] vectors too (dim 0)."""
        if not isinstance(literal, (ast.List, ast.Tuple)):
            if literal is not None and self._mentions_tiled(literal):
                raise _Reject
            return
        elts = literal.elts
        steps = [i for i, e in enumerate(elts) if self._is_step(e)]
        if not steps:
            return
        others_one = all(isinstance(e, ast.Constant) and e.value == 1 for i, e in enumerate(elts) if i not in steps)
        vector = self.dim == 0 and len(elts) == 2 and len(steps) == 1 and others_one
        if not (steps == [self.dim] and op != "reshape") and not vector:
            raise _Reject
        self.covered |= {id(elts[i]) for i in steps}

    def _offsets(self, literal) -> bool:
        """True when the offset along `dim` is the loop variable (a tiled access)."""
        if not isinstance(literal, (ast.List, ast.Tuple)) or len(literal.elts) <= self.dim:
            return False
        e = literal.elts[self.dim]
        if self._is_var(e):
            self.covered.add(id(e))
            return True
        return False

    def _tile_extent(self, node, d, op, valid):
        """A tiled access moves exactly one step along `dim` (and its valid box spans it)."""
        if op in ("slice", "load"):
            extents = [arg(node, *d.shape_arg)] + ([valid] if valid is not None else [])
            extents = [e.elts[self.dim] if isinstance(e, (ast.List, ast.Tuple)) and len(e.elts) > self.dim
                       else None for e in extents]
        else:
            source = arg(node, 1, "source") if op == "assemble" else arg(node, 0, "tile")
            shape = self.shapes.of(source)
            extents = [shape[self.dim] if shape and len(shape) > self.dim else None]
        if not all(e is not None and self._is_step(e) for e in extents):
            raise _Reject

    def _matmul(self, node, op):
        lhs, rhs = (arg(node, 0, "lhs"), arg(node, 1, "rhs")) if op == "matmul" else (
            arg(node, 1, "lhs"), arg(node, 2, "rhs"))
        flags = {k.arg: k.value for k in node.keywords}
        transposed = "a_trans" in flags if self.dim == 0 else "b_trans" in flags
        tiled_side, other_side = (lhs, rhs) if self.dim == 0 else (rhs, lhs)
        if transposed or other_side is None or self._mentions_tiled(other_side) or tiled_side is None:
            raise _Reject


class _Reject(Exception):
    pass
