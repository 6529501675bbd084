"""Calls in a kernel function that run plain Python, whose effects a recorded run (replay.entry) cannot see.

A replay repeats a run's torch calls only. A call of the user's own Python functions or of builtins with effects
(`print`, `open`, `input`) would silently stop happening, so a function making one is never replayed. Allowed:
`pl` ops and constructs, kernel functions (checked when they run), anything pypto_rt or torch defines, pure
builtins and `math`, and method calls on values (statically unknown: tensor views, `self.<kernel>`, list appends).
"""
from __future__ import annotations

import ast
import builtins
import math
import types

from pypto_rt.frontend.resolve import UNRESOLVED, Env
from pypto_rt.frontend.source import parse_function

_PURE_BUILTINS = {getattr(builtins, n) for n in (
    "range", "len", "int", "float", "bool", "min", "max", "abs", "round", "divmod", "isinstance", "tuple", "list",
    "dict", "set", "frozenset", "enumerate", "zip", "sum", "any", "all", "sorted", "reversed", "slice", "str",
    "hasattr", "getattr", "pow", "map", "filter", "type", "complex", "issubclass", "iter", "next", "repr")}
_TRUSTED_ROOTS = ("pypto_rt", "pypto", "torch", "math", "numbers", "operator", "functools", "itertools", "enum",
                  "typing", "dataclasses")


def plain_python_calls(fn) -> list[str]:
    """`file:line name` of each call in `fn`'s source that runs plain Python with possible effects."""
    tree = parse_function(fn)
    return plain_python_calls_in([tree.tree], Env(fn), tree.file)


def plain_python_calls_in(nodes, env: Env, file: str) -> list[str]:
    """The same for statements of a function (an outlined region's body) whose names `env` resolves."""
    found = []
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Call):
                target = env.resolve(node.func)
                if target is not UNRESOLVED and not _trusted(target):
                    found.append(f"{file}:{node.lineno} {ast.unparse(node.func)}()")
    return found


def _trusted(obj) -> bool:
    if any(obj is b for b in _PURE_BUILTINS) or getattr(obj, "__module__", None) == "math" or obj is math:
        return True
    if isinstance(obj, type) and issubclass(obj, (int, float, tuple)):   # enums, named tuples, numbers
        return True
    module = getattr(obj, "__module__", None) or (obj.__name__ if isinstance(obj, types.ModuleType) else None)
    if module is None and hasattr(obj, "__self__"):
        module = getattr(type(obj.__self__), "__module__", None)
    if module is not None and module.split(".")[0] in _TRUSTED_ROOTS:
        return True
    return type(obj).__module__.split(".")[0] in ("pypto_rt",)   # op stubs, kernel functions, scopes
