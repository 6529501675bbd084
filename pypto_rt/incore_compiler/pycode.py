"""Turning generated Python ASTs into functions that run in the user's module, at the user's lines.

Generated code is wrapped in a factory `def __make(<injected names>): <defs>; return (<defs>,)`,
compiled under the user's file name, and the factory is bound to the user's module globals. So
module constants stay live, injected helpers (op implementations, the runtime) are closure
variables, and tracebacks and error spans point at the user's own source lines.
"""
from __future__ import annotations

import ast
import types
from dataclasses import dataclass


_TYPE_PARAMS = {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}


@dataclass(frozen=True)
class Factory:
    """Compiled generated code: `__make(*names)` returns its functions. Code objects marshal, so factories
    are what the disk cache stores."""
    code: types.CodeType
    names: tuple[str, ...]

    def instantiate(self, values: dict, module_globals: dict) -> tuple:
        """The functions, bound to `module_globals`, with `values[name]` for each injected name."""
        make = types.FunctionType(self.code, module_globals, "__make")
        return make(*(values[n] for n in self.names))


def compile_factory(defs: list[ast.FunctionDef], names, file: str, anchor: ast.AST) -> Factory:
    """Compile `defs` inside `def __make(<names>)` under the user's file name."""
    factory = ast.FunctionDef(
        name="__make",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in names], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=list(defs) + [ast.Return(ast.Tuple([ast.Name(d.name, ast.Load()) for d in defs], ast.Load()))],
        decorator_list=[], returns=None, **_TYPE_PARAMS)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.copy_location(factory, anchor)
    ast.fix_missing_locations(module)
    code = compile(module, file, "exec")
    make_code = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == "__make")
    return Factory(make_code, tuple(names))


def build_functions(defs: list[ast.FunctionDef], injected: dict, file: str, module_globals: dict,
                    anchor: ast.AST) -> tuple[Factory, tuple]:
    """Compile `defs` with `injected` names in scope; returns the factory and the function objects in order."""
    factory = compile_factory(defs, list(injected), file, anchor)
    return factory, factory.instantiate(injected, module_globals)


def source_of(defs: list[ast.FunctionDef], header: str = "") -> str:
    """Readable source of generated functions (for PYPTO_DUMP_DIR)."""
    body = "\n\n\n".join(ast.unparse(ast.fix_missing_locations(d)) for d in defs)
    return (header + "\n" if header else "") + body + "\n"


def clone(node, memo: dict | None = None):
    """A deep copy of an AST (positions kept), several times faster than copy.deepcopy.

    `memo`, when given, maps id(original node) -> its copy (to find copied statements again).
    """
    if isinstance(node, list):
        return [clone(n, memo) for n in node]
    if not isinstance(node, ast.AST):
        return node
    copy_ = node.__class__()
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            value = [clone(v, memo) for v in value]
        elif isinstance(value, ast.AST):
            value = clone(value, memo)
        setattr(copy_, field, value)
    for attr in node._attributes:
        if hasattr(node, attr):
            setattr(copy_, attr, getattr(node, attr))
    if memo is not None:
        memo[id(node)] = copy_
    return copy_


def located(node: ast.AST, anchor: ast.AST) -> ast.AST:
    """`node` and its descendants placed at `anchor`'s position (for generated statements)."""
    for child in ast.walk(node):
        if "lineno" in child._attributes:
            ast.copy_location(child, anchor)
    return node


def name(id_: str, store: bool = False) -> ast.Name:
    return ast.Name(id_, ast.Store() if store else ast.Load())


def call(func: str, *args, **kwargs) -> ast.Call:
    return ast.Call(name(func), list(args), [ast.keyword(k, v) for k, v in kwargs.items()])


def arguments(params: list[str]) -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[], kw_defaults=[],
                         defaults=[])
