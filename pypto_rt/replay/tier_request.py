"""What the compiled tier sends to its compile process (replay.tier_process) and how the child reads it back: the
function to trace as its code (marshal: the child runs the same interpreter) with the globals it names, the example
inputs (torch.save: views and memory shared between inputs kept), the carried values, the dims to trace as
symbolic sizes, and the graph pass to run before inductor, named as `module:function` with its leading arguments
(closures do not travel)."""
from __future__ import annotations

import functools
import importlib
import marshal
import sys
import types

import torch

from pypto_rt import knobs


def request(body, constants: tuple | None, examples: list, values: tuple, threads: int, prepare: tuple,
            dynamic: dict | None = None) -> dict:
    """What the child needs to build `body` as replay.tier_inductor.build would: the function as code and the
    globals it names (aten operators and modules by name: they do not pickle), `constants`
    (replay.tier_graph.with_constants' names and tensor count, or None), `prepare` as (`module:function`, its
    leading arguments), `dynamic` (example index -> dims traced as symbolic sizes, or None), and this process's
    import path and inductor cache folder."""
    names = _names(body.__code__)
    scope = {n: _portable(v) for n, v in body.__globals__.items() if n in names or n == "__builtins__"}
    return {"code": marshal.dumps(body.__code__), "globals": scope, "constants": constants, "examples": examples,
            "values": tuple(values), "threads": threads, "prepare": prepare, "dynamic": dynamic, "path": list(sys.path),
            "cache": knobs.INDUCTOR_CACHE_DIR.given()}


def function(request: dict):
    """The function a request carries, as replay.tier_inductor.build takes it (in the child)."""
    scope = {n: _resolved(v) for n, v in request["globals"].items()}
    body = types.FunctionType(marshal.loads(request["code"]), scope)
    if request["constants"]:
        from pypto_rt.replay.tier_graph import with_constants

        return with_constants(body, *request["constants"])
    return body


def preparer(prepare: tuple):
    """`graph -> value`: the function (`module:function`, leading arguments) names."""
    name, args = prepare
    module, attribute = name.split(":")
    return functools.partial(getattr(importlib.import_module(module), attribute), *args)


def _names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


class _Op(str):
    """An aten operator, by its qualified name (`aten::add.Tensor`)."""


class _Module(str):
    """A module, by its name (`torch`)."""


def _portable(value):
    if isinstance(value, torch._ops.OpOverload):
        return _Op(f"{value._schema.name}.{value._overloadname}")
    if isinstance(value, types.ModuleType):
        return _Module(value.__name__)
    return value


def _resolved(value):
    if type(value) is _Module:
        return importlib.import_module(value)
    if type(value) is not _Op:
        return value
    space, rest = value.split("::", 1)
    packet, overload = rest.split(".", 1)
    return getattr(getattr(getattr(torch.ops, space), packet), overload)
