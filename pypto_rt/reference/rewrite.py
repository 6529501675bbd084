"""The source rewrites the eager executor needs: `with pl.spmd(...) [as tid]:` becomes a loop, and carried
loops get the real compiler's results (frontend/carried.py: initial values after zero trips, state carried
without `pl.yield_`).

A context manager cannot run its body n times, so

    with pl.spmd(n, ...) as tid:          __pypto_spmd_3 = pl.spmd(n, ...)
        body                     ->       tid = __pypto_spmd_3.task_id()
                                          for __pypto_block_3 in __pypto_spmd_3:
                                              body

in the same scope (bodies rebind outer names), keeping every line and column, compiled
with the kernel's own file name and run against the kernel's live module globals and
closure values. Functions with neither run unmodified.
"""
from __future__ import annotations

import __future__
import ast
import inspect
import textwrap
import types

from pypto_rt.frontend.carried import bind_carried_results

_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


def _is_spmd_call(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "spmd") or (isinstance(f, ast.Name) and f.id == "spmd")


class _SpmdWith(ast.NodeTransformer):
    def __init__(self):
        self.count = 0

    def visit_FunctionDef(self, node):  # nested defs are left alone (their own decorators handle them)
        if self.count == -1:
            return node
        return self.generic_visit(node)

    def visit_With(self, node: ast.With):
        self.generic_visit(node)
        if len(node.items) != 1 or not _is_spmd_call(node.items[0].context_expr):
            return node
        self.count += 1
        item = node.items[0]
        disp, blk = f"__pypto_spmd_{self.count}", f"__pypto_block_{self.count}"
        out = [ast.Assign(targets=[ast.Name(disp, ast.Store())], value=item.context_expr)]
        if item.optional_vars is not None:
            call = ast.Call(ast.Attribute(ast.Name(disp, ast.Load()), "task_id", ast.Load()), [], [])
            out.append(ast.Assign(targets=[item.optional_vars], value=call))
        out.append(ast.For(target=ast.Name(blk, ast.Store()), iter=ast.Name(disp, ast.Load()), body=node.body,
                           orelse=[]))
        for new in out:
            ast.copy_location(new, node)
            ast.fix_missing_locations(new)
        return out


def _strip_annotations(fn_def: ast.FunctionDef) -> None:
    args = fn_def.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    fn_def.returns = None
    fn_def.decorator_list = []


def rewrite_spmd_with(fn: types.FunctionType) -> types.FunctionType | None:
    """`fn` with its spmd with-statements turned into loops and its carried loops rewritten, or None when it has
    neither (or no source)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    source = "".join(lines)
    if "spmd" not in source and "init_values" not in source:
        return None
    dedented = textwrap.dedent(source)
    indent = len(lines[0]) - len(lines[0].lstrip()) if dedented != source else 0
    tree = ast.parse(dedented)
    fn_def = tree.body[0]
    if not isinstance(fn_def, ast.FunctionDef):
        return None
    transformer = _SpmdWith()
    fn_def.body = [transformer.visit(stmt) for stmt in fn_def.body]
    fn_def.body = [s for item in fn_def.body for s in (item if isinstance(item, list) else [item])]
    if not bind_carried_results(fn_def) and transformer.count == 0:
        return None
    _strip_annotations(fn_def)
    for node in ast.walk(tree):
        if hasattr(node, "lineno"):
            node.lineno += first - 1
            node.end_lineno = (node.end_lineno or node.lineno) + first - 1
            node.col_offset += indent
            if getattr(node, "end_col_offset", None) is not None:
                node.end_col_offset += indent
    return _build(fn, fn_def)


def _build(fn: types.FunctionType, fn_def: ast.FunctionDef) -> types.FunctionType:
    freevars = fn.__code__.co_freevars
    factory = ast.FunctionDef(
        name="__pypto_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(v) for v in freevars], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=[fn_def, ast.Return(ast.Name(fn_def.name, ast.Load()))], decorator_list=[], returns=None)
    ast.copy_location(factory, fn_def)
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    code = compile(module, fn.__code__.co_filename, "exec", flags=fn.__code__.co_flags & _FUTURE_FLAGS,
                   dont_inherit=True)
    namespace: dict = {}
    exec(code, fn.__globals__, namespace)  # noqa: S102 - re-compiling the user's own kernel source
    cells = [c.cell_contents for c in (fn.__closure__ or ())]
    new = namespace["__pypto_factory"](*cells)
    new.__defaults__ = fn.__defaults__
    new.__kwdefaults__ = fn.__kwdefaults__
    return new
