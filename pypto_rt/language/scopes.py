"""Loops and scopes: `pl.range/parallel/pipeline/unroll/spmd/split_aiv`, `pl.at`, `pl.scope`, `pl.yield_`.

These objects only describe; iterating or entering one asks the active executor
(`_runtime.current()`), which decides what running it means.
"""
from __future__ import annotations

import builtins
import warnings
from dataclasses import dataclass, field
from typing import Any

from pypto_rt.errors import DSLError, NotSupportedError, user_span
from pypto_rt.language import _runtime
from pypto_rt.language.enums import Level, SplitMode

__all__ = ["Loop", "Spmd", "Scope", "range", "parallel", "pipeline", "unroll", "spmd", "split_aiv", "at",
           "scope", "manual_scope", "cluster", "yield_", "while_", "cond", "split", "cross_core_slot",
           "Optimization"]


@dataclass
class Loop:
    """A `pl.range`-family loop: kind in range|parallel|pipeline|unroll|split_aiv."""
    kind: str
    start: Any
    stop: Any
    step: Any = 1
    init_values: tuple | None = None
    stage: int | None = None
    mode: Any = None
    span: Any = None

    def __iter__(self):
        return iter(_runtime.current(f"pl.{self.kind}").iterate(self))


def _loop(kind: str, args: tuple, init_values, stage=None) -> Loop:
    if not 1 <= len(args) <= 3:
        raise DSLError(f"pl.{kind} takes (stop), (start, stop) or (start, stop, step); got {len(args)} arguments",
                       user_span(3))
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
    if init_values is not None and not isinstance(init_values, (tuple, list)):
        init_values = (init_values,)
    return Loop(kind, start, stop, step, tuple(init_values) if init_values is not None else None, stage,
                span=user_span(3))


def range(*args, init_values=None) -> Loop:  # noqa: A001 - the DSL's own name
    """Sequential loop; carried state allowed (`init_values=` + `pl.yield_`)."""
    return _loop("range", args, init_values)


def parallel(*args, init_values=None) -> Loop:
    """Loop whose iterations are independent (distributed over cores)."""
    return _loop("parallel", args, init_values)


def pipeline(*args, stage=None, init_values=None) -> Loop:
    """Sequential InCore loop replicated `stage` times for ping-pong buffering."""
    if not isinstance(stage, int) or isinstance(stage, bool) or stage < 1:
        raise DSLError(f"pl.pipeline needs stage= a positive int, got {stage!r}", user_span(2),
                       "write pl.pipeline(n, stage=2)")
    return _loop("pipeline", args, init_values, stage)


def unroll(*args) -> Loop:
    """Loop unrolled at compile time (literal bounds)."""
    return _loop("unroll", args, None)


def split_aiv(n: int = 2, mode=SplitMode.NONE) -> Loop:
    """AIV lanes: the body runs per lane (aiv_id 0, 1); in UP_DOWN / LEFT_RIGHT each lane's `pl.aiv_shard` of a
    cube tile is its half of the rows / columns, in NONE the whole tile."""
    return Loop("split_aiv", 0, n, 1, mode=mode, span=user_span(2))


@dataclass
class Spmd:
    """`pl.spmd(n)`: n blocks of an InCore body. `for i in pl.spmd(n)` or `with pl.spmd(n) [as tid]`."""
    core_num: Any
    name_hint: str = ""
    sync_start: bool = False
    deps: Any = None
    options: dict = field(default_factory=dict)
    span: Any = None

    def __iter__(self):
        return iter(_runtime.current("pl.spmd").iterate(self))

    def task_id(self):
        """The TaskId of the dispatch (the `as tid` of the with form)."""
        return _runtime.current("pl.spmd").enter_scope(self)

    def __enter__(self):
        raise DSLError("`with pl.spmd(...)` must sit in the body of a PyPTO kernel function", self.span,
                       "decorate the function with @pl.jit or @pl.jit.inline")

    def __exit__(self, *exc):
        return False


def spmd(core_num, *, sync_start=False, name_hint="", optimizations=None, deps=None,
         allow_early_resolve=False, predicate=None) -> Spmd:
    """Dispatch `core_num` blocks of an auto-outlined InCore body."""
    if predicate is not None:
        raise NotSupportedError("not supported yet: pl.spmd(predicate=...)", user_span(2))
    return Spmd(core_num, name_hint, sync_start, deps,
                dict(optimizations=optimizations, allow_early_resolve=allow_early_resolve), user_span(2))


@dataclass
class Scope:
    """`pl.at(...)` (kind "at"), `pl.scope()`, `pl.manual_scope()`, `pl.cluster()`."""
    kind: str
    level: Any = None
    role: Any = None
    name_hint: str = ""
    deps: Any = None
    options: dict = field(default_factory=dict)
    span: Any = None

    def __enter__(self):
        return _runtime.current(f"pl.{self.kind}").enter_scope(self)

    def __exit__(self, exc_type, exc, tb):
        _runtime.current(f"pl.{self.kind}").exit_scope(self, exc_type is not None)
        return False


def at(level=Level.CORE_GROUP, role=None, *, optimizations=None, deps=None, no_dep_args=None, dumps=None,
       allow_early_resolve=False, name_hint="", windowize=False) -> Scope:
    """An InCore region (level CORE_GROUP) or a hierarchy scope; `as tid` binds its TaskId."""
    if optimizations is not None and not isinstance(optimizations, (list, tuple)):
        raise DSLError("pl.at(optimizations=...) must be a literal list", user_span(2),
                       "write optimizations=[pl.split(pl.SplitMode.UP_DOWN)]")
    return Scope("at", level, role, name_hint, deps,
                 dict(optimizations=optimizations, no_dep_args=no_dep_args, dumps=dumps,
                      allow_early_resolve=allow_early_resolve, windowize=windowize), user_span(2))


def scope(*args, **kwargs) -> Scope:
    """An auto-dependency scope (bounds task-ring lifetimes)."""
    return Scope("scope", options=dict(kwargs), span=user_span(2))


def manual_scope(*args, **kwargs) -> Scope:
    """A scope whose dependencies are only the explicit `deps=`."""
    return Scope("manual_scope", options=dict(kwargs), span=user_span(2))


def cluster(*args, **kwargs) -> Scope:
    """A cube+vector cluster scope."""
    return Scope("cluster", options=dict(kwargs), span=user_span(2))


def yield_(*values):
    """Carry `values` to the next iteration of the innermost `init_values=` loop; returns them."""
    return _runtime.current("pl.yield_").yield_(values)


def while_(*args, **kwargs):
    """`pl.while_` is not supported yet (unused in the kernel library)."""
    raise NotSupportedError("not supported yet: pl.while_", user_span(2), "use pl.range with a break")


def cond(*args, **kwargs):
    """`pl.cond` is not supported yet (goes with pl.while_)."""
    raise NotSupportedError("not supported yet: pl.cond", user_span(2))


@dataclass(frozen=True)
class Optimization:
    """An entry of `pl.at(optimizations=[...])`: a cube/vector split or a cross-core slot hint."""
    kind: str
    mode: Any = None
    slot_num: int | None = None


def split(mode, slot_num=None) -> Optimization:
    """Cube/vector split hint; `slot_num=` here is deprecated in favour of `pl.cross_core_slot`."""
    if not isinstance(mode, SplitMode):
        raise DSLError(f"pl.split takes a pl.SplitMode, got {mode!r}", user_span(2))
    if slot_num is not None:
        warnings.warn("pl.split(mode, slot_num=N) is deprecated; add pl.cross_core_slot(slot_num=N)",
                      DeprecationWarning, stacklevel=2)
    return Optimization("split", mode, slot_num)


def cross_core_slot(slot_num: int) -> Optimization:
    """Pipe depth between cube and vector cores."""
    if not isinstance(slot_num, builtins.int) or slot_num < 1:
        raise DSLError(f"pl.cross_core_slot(slot_num=) must be a positive int, got {slot_num!r}", user_span(2))
    return Optimization("cross_core_slot", slot_num=slot_num)
