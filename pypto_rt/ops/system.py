"""Task bookkeeping and hints with no effect on results: task_dummy, TaskId arrays, no_dep, prefetch.

In program-order execution every dependency is already satisfied, so these return tokens or
their input unchanged. Executors that schedule tasks read the same calls as ordering edges.
"""
from __future__ import annotations

import itertools

from pypto_rt.errors import OpError
from pypto_rt.ops import dtype_rules, recording
from pypto_rt.ops.registry import op

_ids = itertools.count(1)


class TaskToken:
    """An opaque `pl.TaskId`: names one submitted task (or none, for an empty array slot)."""
    __slots__ = ("id", "name")

    def __init__(self, name: str = ""):
        self.id = next(_ids)
        self.name = name

    def __repr__(self) -> str:
        return f"TaskId({self.id}{', ' + self.name if self.name else ''})"


def _check_deps(deps, opname):
    if deps is not None and not isinstance(deps, (list, tuple)):
        raise OpError(f"pl.{opname}: deps must be a list of TaskIds, got {type(deps).__name__}")


@op("system.task_dummy")
def task_dummy(*, deps=None):
    """A task that does nothing but join `deps`; returns its TaskId."""
    _check_deps(deps, "system.task_dummy")
    return TaskToken("task_dummy")


@op("array.create")
def array_create(n, dtype):
    """A length-n array: TaskId slots start empty (None), integer slots start at 0."""
    dtype = dtype_rules.to_dtype(dtype)
    n = int(n)
    if n < 0:
        raise OpError(f"pl.array.create: negative length {n}")
    fill = None if dtype.name == "TASK_ID" else (0.0 if dtype.is_float() else 0)
    return [fill] * n


@op("no_dep")
def no_dep(t):
    """Mark `t` as carrying no dependency (a scheduling hint)."""
    return t


@op("dump_tag")
def dump_tag(t, *args, **kwargs):
    """Tag `t` for a debug dump (a hint)."""
    return t


class PrefetchContext:
    __slots__ = ()


@op("prefetch.make_context")
def prefetch_make_context(*args, **kwargs):
    """A prefetch context (a hint)."""
    return PrefetchContext()


@op("prefetch.async_prefetch")
def prefetch_async_prefetch(t, ctx=None, *args, **kwargs):
    """Prefetch `t` into L2 (a hint)."""
    return None


@op("system.cacheinvalid")
def cacheinvalid(*args, **kwargs):
    """Invalidate caches (nothing to do on the CPU)."""
    return None


@op("system.fence")
def fence(*args, **kwargs):
    """Memory fence (program order already holds)."""
    return None


@op("aiv_shard", "tile.aiv_shard")
def aiv_shard(x):
    """Marks a cube->vector crossing: an identity."""
    return x


@op("aic_gather", "tile.aic_gather")
def aic_gather(x):
    """Marks a vector->cube crossing: an identity."""
    return x


@op("static_print")
def static_print(*args):
    """Print at compile time (here: when the line runs)."""
    recording.refuse("pl.static_print prints")
    print(*args)


@op("static_assert")
def static_assert(cond, msg: str = "static_assert failed"):
    """Fail with `msg` when `cond` is false."""
    if not cond:
        raise OpError(f"pl.static_assert: {msg}")


@op("func_attr")
def func_attr(attrs=None):
    """Function attributes (no effect here)."""
    return None
