"""Resolving `pl.at`, `pl.Level.CORE_GROUP`, `pl.tensor.assemble`, ... to the objects they name, at compile time.

Only attribute chains rooted at a module, a class or a `pl` namespace are followed: evaluating an
attribute of an arbitrary user object could run user code, so those stay unresolved (`UNRESOLVED`).
"""
from __future__ import annotations

import ast
import builtins
import enum
import types

from pypto_rt.language import scopes
from pypto_rt.language.ops import Namespace, OpStub

UNRESOLVED = object()

# language constructs the front end treats specially, by identity
LOOPS = {scopes.range: "range", scopes.parallel: "parallel", scopes.pipeline: "pipeline", scopes.unroll: "unroll"}


class Env:
    """The names a function's body sees: its closure cells, then its module globals, then builtins."""

    def __init__(self, fn):
        self.globals = fn.__globals__
        self.closure = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:  # an empty cell: not bound yet
                pass

    def lookup(self, name: str):
        if name in self.closure:
            return self.closure[name]
        if name in self.globals:
            return self.globals[name]
        return getattr(builtins, name, UNRESOLVED)

    def resolve(self, node: ast.AST):
        """The object `node` (a Name or an attribute chain) names, or UNRESOLVED."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is UNRESOLVED or not _safe_to_inspect(base):
                return UNRESOLVED
            try:
                return getattr(base, node.attr)
            except AttributeError:
                return UNRESOLVED
        return UNRESOLVED


def _safe_to_inspect(obj) -> bool:
    return isinstance(obj, (types.ModuleType, Namespace, type, enum.EnumMeta))


def callee(env: Env, call: ast.AST):
    """What a Call node calls, when it is statically known."""
    return env.resolve(call.func) if isinstance(call, ast.Call) else UNRESOLVED


def op_name(obj) -> str | None:
    """The qualified op name of a `pl` op stub (`"tensor.assemble"`), else None."""
    return obj.qualname if isinstance(obj, OpStub) else None


def is_loop(obj) -> bool:
    """`pl.range/parallel/pipeline/unroll` (compared by identity: `obj` may be unhashable)."""
    return any(obj is f for f in LOOPS)

