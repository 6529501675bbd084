"""`Runtime`: what a program embedding pypto-rt holds — its options, its engines' lock and worker pool — and
`RunResult`, a call's outputs with its stats. Imports knobs, options, run_stats and aicpu.resources from pypto_rt.

A runtime applies where it is active: inside `with rt:` / `rt.activate()` / `rt.options(...)`, and for the
calls `rt.run` makes. Activation is a `contextvars` scope (as `decimal.localcontext` is): it holds for the calling
thread, and a thread started inside starts from the defaults unless it runs in a copy of the context
(`contextvars.copy_context().run`). Plain `@pl.jit` calls anywhere else use `default_runtime()`, whose options are
the environment's. Per-kernel state (compiled programs, replay recordings) belongs to each kernel function
(`KernelFunction.state`) and is shared by every runtime: it depends only on the kernel and its specialisation.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from pypto_rt import run_stats
from pypto_rt.aicpu import resources
from pypto_rt.options import Options, as_options, scoped


@dataclass
class RunResult:
    """One call made by `Runtime.run`: `outputs` (what the kernel call returned; Out/InOut tensors are also
    written in place, as always) and `stats` (a RunStats: tasks, edges, time split, the replay decision)."""
    outputs: Any
    stats: run_stats.RunStats


class Runtime:
    """pypto-rt for one embedding program: options (PYPTO_* knobs as typed fields; the environment gives what
    they leave unset), and its own engine lock and worker pool, so two runtimes (different worker counts, say)
    do not restart each other's workers.

    Example::

        rt = pypto_rt.Runtime(num_workers=2)
        result = rt.run(kernel, x, y, out)          # result.outputs, result.stats.tasks
        with rt.options(executor="reference"):       # for this block, in this thread's context
            kernel(x, y, out)
    """

    def __init__(self, options: Options | dict | None = None, *, name: str = "runtime", **fields):
        self.name = name
        self.base = as_options(options).merged(fields)
        self.home = resources.EngineResources(name)
        self._entered = threading.local()   # per thread: the exit stacks of `with rt:` blocks, innermost last

    @contextlib.contextmanager
    def activate(self):
        """A with block in which kernel calls (in this context) use this runtime."""
        with resources.use(self.home), scoped(self.base):
            yield self

    @contextlib.contextmanager
    def options(self, options: Options | dict | None = None, **fields):
        """A with block in which this runtime is active with some options overridden (`executor="reference"`,
        `stats=True`, ...); they end with the block."""
        with self.activate(), scoped(as_options(options).merged(fields)):
            yield self

    def __enter__(self) -> Runtime:
        stack = contextlib.ExitStack()
        stack.enter_context(self.activate())
        self._stacks().append(stack)
        return self

    def __exit__(self, *exc) -> None:
        self._stacks().pop().close()

    def _stacks(self) -> list:
        stacks = getattr(self._entered, "stacks", None)
        if stacks is None:
            stacks = self._entered.stacks = []
        return stacks

    def run(self, fn, *args, **kwargs) -> RunResult:
        """Call kernel `fn(*args, **kwargs)` under this runtime; returns its outputs and stats."""
        with self.activate(), run_stats.collect(getattr(fn, "name", "")) as stats:
            start = time.perf_counter_ns()
            outputs = fn(*args, **kwargs)
            stats.wall_ns = time.perf_counter_ns() - start
        return RunResult(outputs, stats)

    def compile(self, fn, *args, config: Options | dict | None = None, **kwargs):
        """`fn.compile(...)` under this runtime's options (and `config`'s); the result runs with them too."""
        with self.activate():
            return fn.compile(*args, config=self.base.merged(config), **kwargs)

    def current_options(self) -> Options:
        """The options in force for calls made under this runtime here (its own, over the environment)."""
        with self.activate():
            return Options.current()

    @property
    def worker_pool_size(self) -> int | None:
        """Lanes of this runtime's worker pool (None until its first compiled run starts one)."""
        return self.home.pool_size

    def close(self) -> None:
        """Let this runtime's workers end (a later run starts new ones)."""
        self.home.close()

    def __repr__(self) -> str:
        return f"<pypto_rt.Runtime {self.name} {self.base.overrides() or 'environment defaults'}>"


class _DefaultRuntime(Runtime):
    """The process's runtime: the environment's options, the engine resources plain calls use."""

    def __init__(self):   # (not Runtime's: no resources of its own)
        self.name, self.base, self.home = "default", Options(), resources.DEFAULT
        self._entered = threading.local()


_default: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The runtime plain `@pl.jit` calls use: options from the environment, the process's worker pool."""
    global _default
    with _default_lock:
        if _default is None:
            _default = _DefaultRuntime()
        return _default
