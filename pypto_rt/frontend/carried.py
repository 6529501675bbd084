"""Carried loops (`for i, (a, b) in pl.range(n, init_values=(a0, b0)):`) with the real compiler's SSA meaning.

The real compiler turns a carried loop into iter_args and return_vars: after a loop that runs zero times the
return values are the initial values, and a body that only rebinds its state names (the seed's form, no
`pl.yield_`) still carries them. Run as plain Python, neither holds: a name bound by `x = pl.yield_(...)` in
the body is unbound after zero trips, and rebinding `a` does not reach the next iteration. So every such loop

    for i, (a, b) in pl.range(n, init_values=INIT):        __pypto_init_N = INIT
        ...                                          ->    x = __pypto_init_N[0]      (one `x = pl.yield_(v)`)
        x = pl.yield_(v)                                   for i, (a, b) in pl.range(n, init_values=__pypto_init_N):
                                                               ...
                                                               x = pl.yield_(v)

and a body without `pl.yield_` gets `a, b = __pypto_init_N` before the loop and `pl.yield_(a, b)` as its last
statement. INIT is evaluated once, as before; inserted nodes carry the loop's own position.
"""
from __future__ import annotations

import ast
import copy


def _is_yield(call) -> bool:
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "yield_") or (isinstance(f, ast.Name) and f.id == "yield_")


def _init_keyword(loop: ast.For) -> ast.keyword | None:
    if not isinstance(loop.iter, ast.Call):
        return None
    return next((k for k in loop.iter.keywords if k.arg == "init_values"), None)


def _own_yields(body) -> list:
    """The body's top-level `pl.yield_` statements (nested loops' yields are their own)."""
    return [s for s in body if _is_yield(getattr(s, "value", None)) and isinstance(s, (ast.Assign, ast.Expr))]


def _state_names(loop: ast.For):
    """The loop's state tuple `(a, b)` of `for i, (a, b) in ...` when it is one of plain names, else None."""
    target = loop.target
    if isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Tuple):
        state = target.elts[1].elts
        if state and all(isinstance(n, ast.Name) for n in state):
            return [n.id for n in state]
    return None


class _CarriedLoops(ast.NodeTransformer):
    def __init__(self):
        self.count = 0

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        keyword = _init_keyword(node)
        if keyword is None:
            return node
        self.count += 1
        init = f"__pypto_init_{self.count}"
        before = [ast.Assign([ast.Name(init, ast.Store())], keyword.value)]
        keyword.value = ast.Name(init, ast.Load())
        yields = _own_yields(node.body)
        for stmt in yields:
            if isinstance(stmt, ast.Assign):
                value = ast.Name(init, ast.Load())
                if len(stmt.value.args) == 1:
                    value = ast.Subscript(value, ast.Constant(0), ast.Load())
                before.append(ast.Assign([copy.deepcopy(t) for t in stmt.targets], value))
        names = _state_names(node)
        if not yields and names and isinstance(node.iter.func, ast.Attribute):
            store = ast.Tuple([ast.Name(n, ast.Store()) for n in names], ast.Store())
            before.append(ast.Assign([store], ast.Name(init, ast.Load())))
            func = ast.Attribute(copy.deepcopy(node.iter.func.value), "yield_", ast.Load())
            node.body.append(ast.Expr(ast.Call(func, [ast.Name(n, ast.Load()) for n in names], [])))
        return [_located(n, node) for n in before] + [_located(node, node)]


def _located(new, where):
    """`new` with the position of `where` on every node that has none (moved user nodes keep theirs)."""
    for n in ast.walk(new):
        if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
            ast.copy_location(n, where)
    return new


def bind_carried_results(fn_def: ast.FunctionDef) -> bool:
    """Rewrite `fn_def`'s carried loops in place (see the module doc); whether there was any."""
    transformer = _CarriedLoops()
    fn_def.body = _flatten([transformer.visit(stmt) for stmt in fn_def.body])
    return transformer.count > 0


def _flatten(items) -> list:
    return [s for item in items for s in (item if isinstance(item, list) else [item])]
