"""The code a recorded run executes: arithmetic and comparisons routed so no value read from data is lost.

A run recorded for replay gets numbers read from data as `TracedInt`s and `TracedFloat`s (replay.scalars).
Python computes `1.5 * n`, `1.0 / n` and `0.5 < n` with float's own method, which reads an int subclass as a plain
int without asking, and `math.sqrt(x)` reads any int or float subclass that way: the replay would keep the
number seen when recording. The recorded run therefore executes a variant of the host program and kernels in
which every binary operation, comparison and `min`/`max` call goes through `replay.scalars.arithmetic` /
`compare` (which hand such a pair to the traced value's reflected method); calls into numeric modules
(`math.floor(x)`, `np.sqrt(x)`), `range` bounds and subscripts of anything but a tensor (a list, a tuple) pin
their traced numbers first. That costs a function call per operation, so only recorded runs execute this
variant; other runs execute the plain code. Results are the same: only who computes them differs.
"""
from __future__ import annotations

import ast
import types

from pypto_rt.replay.scalars import arithmetic, compare, host_key, largest, plain, smallest

# modules whose functions read numbers in C without asking: their calls get plain (pinned) numbers
_NUMERIC_MODULES = {"math", "cmath", "numpy", "statistics", "fractions", "decimal", "random"}

_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow", ast.LShift: "lshift", ast.RShift: "rshift", ast.BitAnd: "and_",
           ast.BitOr: "or_", ast.BitXor: "xor", ast.MatMult: "matmul"}
_COMPARE = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}


def pinned_call(function, *args, **kwargs):
    """`function(*args, **kwargs)` with traced numbers among the arguments pinned."""
    return function(*(plain(a) for a in args), **{k: plain(v) for k, v in kwargs.items()})


# what the variant runs with, over the plain code's names (kernels add pinning `__subscript` helpers, see
# torch_backend; `__range`, which pins through int(), is the plain code's own)
RUNTIME_NAMES = {"__arithmetic": arithmetic, "__compare": compare, "__min": smallest, "__max": largest,
                 "__pinned_call": pinned_call, "__key": host_key}


def route(tree: ast.AST, module_globals: dict, shadowed: set[str] = frozenset()) -> ast.AST:
    """Rewrite `tree` in place for a recorded run (names in `shadowed` are not the builtins min/max; module
    globals tell which names are numeric modules)."""
    numeric = {name for name, value in module_globals.items() if _numeric(value)}
    _Router(shadowed, numeric).visit(tree)
    ast.fix_missing_locations(tree)
    return tree


class _Router(ast.NodeTransformer):
    def __init__(self, shadowed, modules):
        self.shadowed = shadowed
        self.modules = modules
        self.temps = 0

    def visit_BinOp(self, node):
        self.generic_visit(node)
        name = _BINARY.get(type(node.op))
        if name is None:
            return node
        return ast.copy_location(ast.Call(ast.Name("__arithmetic", ast.Load()),
                                          [ast.Constant(name), node.left, node.right], []), node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        name = _BINARY.get(type(node.op))
        if name is None or not isinstance(node.target, ast.Name):
            return node
        value = ast.Call(ast.Name("__arithmetic", ast.Load()),
                         [ast.Constant(name), ast.Name(node.target.id, ast.Load()), node.value], [])
        return ast.copy_location(ast.Assign([node.target], value), node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        if any(type(op) not in _COMPARE for op in node.ops):
            return node   # `is`, `in`: no arithmetic
        left, parts = node.left, []
        for i, (op, right) in enumerate(zip(node.ops, node.comparators)):
            if i < len(node.ops) - 1:   # a chain: each middle operand is evaluated once
                temp = f"__chained{self.temps}"
                self.temps += 1
                right = ast.NamedExpr(ast.Name(temp, ast.Store()), right)
                parts.append(_compare_call(op, left, right))
                left = ast.Name(temp, ast.Load())
            else:
                parts.append(_compare_call(op, left, right))
        out = parts[0] if len(parts) == 1 else ast.BoolOp(ast.And(), parts)
        return ast.copy_location(out, node)

    def visit_Subscript(self, node):
        """`x[k]` -> `x[__key(x, k)]` (`x` a name; else `__key(None, k)`): a list or tuple index is pinned."""
        self.generic_visit(node)
        owner = ast.Name(node.value.id, ast.Load()) if isinstance(node.value, ast.Name) else ast.Constant(None)
        node.slice = ast.copy_location(ast.Call(ast.Name("__key", ast.Load()), [owner, node.slice], []), node.slice)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("min", "max", "range") and func.id not in self.shadowed:
            node.func = ast.copy_location(ast.Name(f"__{func.id}", ast.Load()), func)
        elif _root(func) in self.modules:   # math.floor(x), np.sqrt(x), sqrt(x) from math: x pinned
            node.args.insert(0, func)
            node.func = ast.copy_location(ast.Name("__pinned_call", ast.Load()), func)
        return node


def _numeric(value) -> bool:
    """A numeric module, or a function from one (`from math import sqrt`)."""
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".")[0] in _NUMERIC_MODULES
    module = getattr(value, "__module__", None)
    return callable(value) and isinstance(module, str) and module.split(".")[0] in _NUMERIC_MODULES


def _root(node) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _compare_call(op, left, right) -> ast.Call:
    return ast.Call(ast.Name("__compare", ast.Load()), [ast.Constant(_COMPARE[type(op)]), left, right], [])
