"""Name -> implementation table of the op library, and each op's `OpDef` (ops/opdef.py).

An op is registered under every qualified name it answers to: `"add"` (pl.add),
`"tensor.add"` (pl.tensor.add), `"tile.add"` (pl.tile.add), `"system.task_dummy"`, ...
Implementations take `TensorValue`s and Python scalars with the op's real signature,
raise `OpError` for misuse (the executor attaches the user's line), and return a
`TensorValue`, a scalar, or the in-place target. The registration also declares what the
compiler and the host need to know about the op (`@op(..., shape=SAME, broadcasts=True)`), and
gives the implementation the op's user-facing doc (language/opdocs.py, which `help(pl.<op>)` shows).
Filled at import, never mutated after.
"""
from __future__ import annotations

from typing import Callable

from pypto_rt.errors import NotSupportedError
from pypto_rt.language.opdocs import doc_of
from pypto_rt.ops.opdef import OpDef, declare

OPS: dict[str, Callable] = {}
# In-place ops: name -> the parameter holding the tensor they write (OpDef.writes). Executors check that the
# target does not alias an entry parameter annotated In (DESIGN.md, "Directions").
IN_PLACE_TARGETS: dict[str, str] = {}


def op(*names: str, **facts):
    """Register the decorated function under each of `names`, with the OpDef fields in `facts`."""
    def deco(fn):
        for name in names:
            if name in OPS:
                raise RuntimeError(f"op {name!r} registered twice")
            OPS[name] = fn
        opdef = declare(OpDef(names, doc=doc_of(names[0]), **facts))
        if opdef.writes is not None:
            IN_PLACE_TARGETS.update(dict.fromkeys(names, opdef.writes))
        if opdef.doc:
            fn.__doc__ = opdef.doc
        return fn
    return deco


def not_supported(*names: str, why: str = ""):
    """Register names the language exposes but this runtime cannot execute yet."""
    for name in names:
        def fail(*_args, _name=name, **_kwargs):
            raise NotSupportedError(f"not supported yet: pl.{_name}" + (f" ({why})" if why else ""))
        fail.not_supported = True
        op(name)(fail)

