"""Which part of each tensor input an InCore kernel reads and writes, as boxes computable at submit time.

For every tensor parameter the kernel touches, the plan lists boxes with a mode ("r", "w", "rw").
A box dimension is exact when its offset and size are expressions of the kernel's inputs and module
constants; anything computed inside the kernel (a block index, an inner loop variable) widens that
dimension to the whole extent — the conservative case the task graph must still order correctly.
A parameter used in a way this analysis does not model (passed to a helper, written by an op with
no box rule) is "rw" over its whole extent.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass

from pypto_rt.frontend import names
from pypto_rt.frontend.resolve import Env, callee, op_name
from pypto_rt.incore_compiler.shapes import ShapeInference, arg, base_op, subscript_box
from pypto_rt.ops import OPS
from pypto_rt.ops.opdef import opdef
from pypto_rt.ops.registry import IN_PLACE_TARGETS


@dataclass
class ParamAccess:
    """How a kernel touches one tensor parameter: a box of expressions, bound at submit time into aicpu TaskAccesses."""
    param: str
    mode: str                       # "r" | "w" | "rw"
    offsets: list | None = None     # per-dim expressions (None entry: whole dim / from 0)
    sizes: list | None = None       # per-dim expressions (None entry: to the end)
    line: int = 0                   # the line of a definite write (0: the write is only assumed)
    atomic: bool = False            # an atomic add (`atomic=` other than None_), or maybe one (a helper's): mode "rw"



def plan_accesses(env: Env, body, params: list[str], block_var: str | None = None,
                  aliased=()) -> list[ParamAccess]:
    """The access plan of a kernel whose inputs are `params` and whose code is `body`.

    `aliased` parameters are rebound only to themselves (`h = pl.assemble(h, ...)`); any other
    parameter the body rebinds is treated as touched whole, read and written.
    """
    local = (names.stored_names(body) | ({block_var} if block_var else set())) - set(aliased)
    shapes = ShapeInference(env, body)
    planner = _Planner(env, set(params) - local, local, shapes)
    for stmt in body:
        planner.visit(stmt)
    rebound = [ParamAccess(p, "rw") for p in params if p in local]
    return rebound + planner.finish()


class _Planner(ast.NodeVisitor):
    def __init__(self, env: Env, params: set[str], local: set[str], shapes: ShapeInference):
        self.env, self.params, self.local, self.shapes = env, params, local, shapes
        self.accesses: list[ParamAccess] = []
        self.aliases: dict[str, ParamAccess] = {}   # local name -> the box of a parameter it views
        self.covered: set[int] = set()         # Name nodes already accounted for

    def finish(self) -> list[ParamAccess]:
        """One whole-extent entry per (param, mode) when any access is unbounded; duplicates dropped."""
        whole = {(a.param, a.mode) for a in self.accesses if a.offsets is None}
        seen, out = set(), []
        for a in self.accesses:
            key = (a.param, a.mode) if (a.param, a.mode) in whole else (
                a.param, a.mode, tuple(ast.dump(e) if e is not None else None for e in a.offsets + a.sizes))
            key += (a.atomic,)
            if key not in seen:
                seen.add(key)
                out.append(a if len(key) == 4 else ParamAccess(a.param, a.mode, line=a.line, atomic=a.atomic))
        return out

    # -- helpers ---------------------------------------------------------------------------------
    def _exact(self, expr):
        """`expr` when it can be evaluated before the kernel runs, else None (whole dimension)."""
        if expr is None:
            return None
        used = names.loaded_names([expr])
        return None if used & self.local else expr

    def _box(self, offsets, sizes):
        """Per-dim exact expressions; a dimension whose offset is not exact is whole (its size says nothing)."""
        offs = [self._exact(o) for o in offsets]
        return offs, [self._exact(s) if o is not None else None for o, s in zip(offs, sizes)]

    def _target(self, node):
        """The parameter box a Name refers to (a parameter itself or a view alias of one), else None."""
        if not isinstance(node, ast.Name):
            return None
        if node.id in self.aliases:
            return self.aliases[node.id]
        if node.id in self.params:
            return ParamAccess(node.id, "r")
        return None

    def _record(self, base: ParamAccess, mode: str, offsets=None, sizes=None, line=0, node=None, atomic=False):
        if node is not None:
            self.covered.add(id(node))
        if base.offsets is not None:   # an access through a view: the view's box bounds it
            offsets, sizes = base.offsets, base.sizes
        self.accesses.append(ParamAccess(base.param, mode, offsets, sizes, line, atomic))

    # -- visitors --------------------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign):
        self.visit(node.value)
        for target in node.targets:
            if isinstance(target, ast.Subscript):
                base = self._target(target.value)
                if base is not None:
                    box = subscript_box(target)
                    offsets, sizes = self._box(*box) if box else (None, None)
                    self._record(base, "w", offsets, sizes, node.lineno, target.value)
                    self.visit(target.slice)
                    continue
            self.visit(target)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self._maybe_alias(node.targets[0].id, node.value)

    def _maybe_alias(self, name: str, value):
        view = None
        if isinstance(value, ast.Subscript):
            base = self._target(value.value)
            box = subscript_box(value)
            if base is not None:
                view = ParamAccess(base.param, "r", *(self._box(*box) if box else (None, None)))
        elif isinstance(value, ast.Call) and value.args:
            qual = op_name(callee(self.env, value))
            op, d = base_op(qual), opdef(qual)
            base = self._target(value.args[0])
            if base is not None and op == "slice":
                offsets = arg(value, 2, "offset")
                shape = arg(value, 1, "shape")
                if isinstance(offsets, (ast.List, ast.Tuple)) and isinstance(shape, (ast.List, ast.Tuple)):
                    view = ParamAccess(base.param, "r", *self._box(offsets.elts, shape.elts))
                else:
                    view = ParamAccess(base.param, "r")
            elif base is not None and d is not None and d.is_view:
                view = ParamAccess(base.param, "r")
        if view is not None:
            self.aliases[name] = view
        else:
            self.aliases.pop(name, None)

    def visit_Subscript(self, node: ast.Subscript):
        base = self._target(node.value)
        if base is not None and isinstance(node.ctx, ast.Load):
            box = subscript_box(node)
            self._record(base, "r", *(self._box(*box) if box else (None, None)), node.lineno, node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call):
        target = callee(self.env, node)
        qual = op_name(target)
        op = base_op(qual)
        if qual is not None and qual in IN_PLACE_TARGETS:
            self._in_place(node, qual, op)
        elif op in ("load", "slice", "read") and node.args:
            base = self._target(node.args[0])
            if base is not None:
                self._record(base, "r", *self._read_box(node, op), node.lineno, node.args[0])
        elif qual is None:   # a helper or kernel: it may write what it is given (atomic adds too)
            for a in list(node.args) + [k.value for k in node.keywords]:
                base = self._target(a)
                if base is not None:
                    self._record(base, "rw", node=a, atomic=True)
        self.generic_visit(node)

    def _read_box(self, node, op):
        if op == "load":
            offs, shp = arg(node, 1, "offsets"), arg(node, 2, "shapes")
        elif op == "slice":
            offs, shp = arg(node, 2, "offset"), arg(node, 1, "shape")
        else:
            offs = arg(node, 1, "indices")
            shp = ast.List([ast.Constant(1)] * len(offs.elts)) if isinstance(offs, (ast.List, ast.Tuple)) else None
        if isinstance(offs, (ast.List, ast.Tuple)) and isinstance(shp, (ast.List, ast.Tuple)):
            return self._box(offs.elts, shp.elts)
        return None, None

    def _in_place(self, node, qual, op):
        param = IN_PLACE_TARGETS[qual]
        position = list(inspect.signature(OPS[qual]).parameters).index(param)
        written = arg(node, position, param)
        base = self._target(written)
        if base is None:
            return
        offsets = sizes = None
        atomic = any(k.arg == "atomic" for k in node.keywords)
        adds = any(k.arg == "atomic" and not _names_none(k.value) for k in node.keywords)
        if op == "assemble":
            offsets, sizes = arg(node, 2, "offset"), self.shapes.of(arg(node, 1, "source"))
        elif op == "store":
            offsets = arg(node, 1, "offsets")
            literal = arg(node, 3, "shapes")
            sizes = literal.elts if isinstance(literal, (ast.List, ast.Tuple)) else self.shapes.of(node.args[0])
        elif op == "write":
            offsets = arg(node, 1, "indices")
            if isinstance(offsets, (ast.List, ast.Tuple)):
                sizes = [ast.Constant(1)] * len(offsets.elts)
        if isinstance(offsets, (ast.List, ast.Tuple)):
            offsets, sizes = self._box(offsets.elts, sizes or [None] * len(offsets.elts))
        else:
            offsets = sizes = None
        self._record(base, "rw" if atomic else "w", offsets, sizes, node.lineno, written, adds)

    def visit_Name(self, node: ast.Name):
        if id(node) in self.covered or not isinstance(node.ctx, ast.Load):
            return
        base = self._target(node)
        if base is not None:   # read whole: an operand of an op, a return value, ...
            self._record(base, "r", line=node.lineno)


def _names_none(expr) -> bool:
    """`atomic=None`, `atomic=pl.AtomicType.None_` (or another spelling ending in None_): no atomic add."""
    if isinstance(expr, ast.Constant):
        return expr.value is None
    return isinstance(expr, ast.Attribute) and expr.attr == "None_"
