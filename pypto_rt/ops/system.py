"""Task bookkeeping and hints with no effect on results: task_dummy, TaskId arrays, no_dep, prefetch.

In program-order execution every dependency is already satisfied, so these return tokens or
their input unchanged. Executors that schedule tasks read the same calls as ordering edges.
"""
from __future__ import annotations

import itertools

from pypto_rt.errors import OpError
from pypto_rt.ops import dtype_rules, recording
from pypto_rt.ops.opdef import ANY_DIM, Shape
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
    _check_deps(deps, "system.task_dummy")
    return TaskToken("task_dummy")


@op("array.create", waits_on_host=False)
def array_create(n, dtype):
    dtype = dtype_rules.to_dtype(dtype)
    n = int(n)
    if n < 0:
        raise OpError(f"pl.array.create: negative length {n}")
    fill = None if dtype.name == "TASK_ID" else (0.0 if dtype.is_float() else 0)
    return [fill] * n


@op("no_dep", shape=Shape.SAME, coalesce=ANY_DIM, waits_on_host=False)
def no_dep(t):
    return t


@op("dump_tag", waits_on_host=False)
def dump_tag(t, *args, **kwargs):
    return t


class PrefetchContext:
    __slots__ = ()


@op("prefetch.make_context", waits_on_host=False)
def prefetch_make_context(*args, **kwargs):
    return PrefetchContext()


@op("prefetch.async_prefetch", waits_on_host=False)
def prefetch_async_prefetch(t, ctx=None, *args, **kwargs):
    return None


@op("system.cacheinvalid", waits_on_host=False)
def cacheinvalid(*args, **kwargs):
    return None


@op("system.fence", waits_on_host=False)
def fence(*args, **kwargs):
    return None


@op("aiv_shard", "tile.aiv_shard", shape=Shape.SAME, coalesce=ANY_DIM)
def aiv_shard(x):
    return x


@op("aic_gather", "tile.aic_gather", shape=Shape.SAME, coalesce=ANY_DIM)
def aic_gather(x):
    return x


@op("static_print", waits_on_host=False)
def static_print(*args):
    recording.refuse("pl.static_print prints")
    print(*args)


@op("static_assert", waits_on_host=False)
def static_assert(cond, msg: str = "static_assert failed"):
    if not cond:
        raise OpError(f"pl.static_assert: {msg}")


@op("func_attr", waits_on_host=False)
def func_attr(attrs=None):
    return None
