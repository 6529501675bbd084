"""Name -> implementation table of the op library.

An op is registered under every qualified name it answers to: `"add"` (pl.add),
`"tensor.add"` (pl.tensor.add), `"tile.add"` (pl.tile.add), `"system.task_dummy"`, ...
Implementations take `TensorValue`s and Python scalars with the op's real signature,
raise `OpError` for misuse (the executor attaches the user's line), and return a
`TensorValue`, a scalar, or the in-place target. Filled at import, never mutated after.
"""
from __future__ import annotations

from typing import Callable

from pypto_rt.errors import NotSupportedError

OPS: dict[str, Callable] = {}


def op(*names: str):
    """Register the decorated function under each of `names`."""
    def deco(fn):
        for name in names:
            if name in OPS:
                raise RuntimeError(f"op {name!r} registered twice")
            OPS[name] = fn
        return fn
    return deco


def not_supported(*names: str, why: str = ""):
    """Register names the language exposes but this runtime cannot execute yet."""
    for name in names:
        def fail(*_args, _name=name, **_kwargs):
            raise NotSupportedError(f"not supported yet: pl.{_name}" + (f" ({why})" if why else ""))
        fail.not_supported = True
        op(name)(fail)


# In-place ops: name -> the parameter holding the tensor they write. Executors check that the
# target does not alias an entry parameter annotated In (DESIGN.md, "Directions").
IN_PLACE_TARGETS: dict[str, str] = {}


def writes(param: str):
    """Mark the decorated op (all its registered names) as writing into argument `param`."""
    def deco(fn):
        for name, impl in list(OPS.items()):
            if impl is fn:
                IN_PLACE_TARGETS[name] = param
        fn.__pypto_writes__ = param
        return fn
    return deco
