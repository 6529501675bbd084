"""Kernel decorators: `@pl.jit` (+ `.inline/.incore/.opaque/.host/.extern`), `@pl.program`, `@pl.function`.

A decorator only captures the function and its options in a `KernelFunction`. Calling one:
- inside a running kernel -> the active executor (`call_kernel`) runs it in place;
- from plain Python (an entry) -> `pypto_rt.driver.run_entry`, reached through the one
  deferred import below (the sanctioned upward edge of the language layer).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import weakref
from typing import Any, Callable

from pypto_rt.errors import DSLError, NotSupportedError, user_span
from pypto_rt.kernel_state import NOT_SETTLED, KernelState
from pypto_rt.language import _runtime
from pypto_rt.language.enums import FunctionType

__all__ = ["KernelFunction", "ProgramNamespace", "jit", "function", "inline", "program", "program_entry"]

ENTRY_KINDS = ("jit", "host", "function", "opaque", "incore")


class ProgramNamespace:
    """What `self` names inside a `@pl.jit` kernel and the `@pl.jit.inline` functions it calls: the real `@pl.jit`
    materialises the kernel as a `@pl.program` whose methods are the module's kernel functions, so kernel-library
    code writes `pl.spmd_submit(self.helper, ...)`. Attributes are the module's globals (read when asked)."""
    __slots__ = ("_globals",)

    def __init__(self, module_globals: dict):
        self._globals = module_globals

    def __getattr__(self, name: str):
        try:
            return self._globals[name]
        except KeyError:
            module = self._globals.get("__name__", "?")
            raise DSLError(f"self.{name}: the program has no function {name!r} (module {module})",
                           user_span(2), f"define {name} at the module level of {module}") from None

    def __repr__(self) -> str:
        return f"<program namespace of {self._globals.get('__name__', '?')}>"


_driver_run_entry = None   # driver.run_entry, imported on the first entry call


def _run_entry():
    """driver.run_entry (deferred: the one upward edge, language -> driver; kept, since a kernel call is a hot
    path and a `from package import module` costs a microsecond each time)."""
    global _driver_run_entry
    if _driver_run_entry is None:
        from pypto_rt import driver
        _driver_run_entry = driver.run_entry
    return _driver_run_entry


class KernelFunction:
    """A decorated PyPTO function. `kind`: jit | inline | incore | opaque | host | function | extern.

    `serial`: this process's creation number; `KernelFunction.made(serial)` finds the kernel again, also in a
    process forked after it was made (how a host-form job names a kernel a factory made, which has no importable
    qualified name)."""

    _serials = itertools.count()
    _made: "weakref.WeakValueDictionary[int, KernelFunction]" = weakref.WeakValueDictionary()

    def __init__(self, fn: Callable, kind: str, options: dict):
        if not inspect.isfunction(fn):
            raise DSLError(f"@pl.{kind} decorates a function, got {type(fn).__name__}", user_span(3))
        self.fn = fn
        self.kind = kind
        self.options = options
        self.span = user_span(3)
        self.state = KernelState()   # what each layer keeps for this kernel (compiled programs, replays, ...)
        self.serial = next(KernelFunction._serials)
        KernelFunction._made[self.serial] = self
        functools.update_wrapper(self, fn)

    @classmethod
    def made(cls, serial: int) -> "KernelFunction | None":
        return cls._made.get(serial)

    @property
    def name(self) -> str:
        return self.fn.__qualname__

    def __call__(self, *args, **kwargs):
        ex = _runtime.active()
        if ex is not None:
            return ex.call_kernel(self, args, kwargs)
        settled = self.state.settled
        if settled is not None and not kwargs:   # a replay with nothing left to decide (replay.settled)
            result = settled(args)
            if result is not NOT_SETTLED:
                return result
        if self.kind == "extern":
            raise NotSupportedError(f"not supported yet: @pl.jit.extern kernel {self.name} (hand-written "
                                    "device C++ cannot run on the CPU)", user_span(2))
        if self.kind == "inline":
            raise DSLError(f"{self.name} is a @pl.jit.inline kernel; it runs only when called from a kernel",
                           user_span(2), "call it from a @pl.jit function, or decorate it with @pl.jit")
        return _run_entry()(self, args, kwargs)

    def compile(self, *args, config=None, **kwargs):
        """Check the arguments and compile the kernel without running it; returns an entry that runs it:
        `compiled = fn.compile(x, y, out)` then `compiled(x, y, out)`. `config`: options in force while compiling
        and whenever the compiled entry runs, as a `pypto_rt.Options` or a dict of its fields (e.g.
        `{"coalesce": False}`); None: those in force where it is called."""
        from pypto_rt import driver
        return driver.compile_entry(self, args, kwargs, config)

    def annotations(self) -> dict:
        """Evaluated parameter annotations, cached (handles `from __future__ import annotations`)."""
        cached = self.state.annotations
        if cached is None:
            try:
                cached = inspect.get_annotations(self.fn, eval_str=True)
            except Exception as e:  # noqa: BLE001 - any failure here is the user's annotation
                raise DSLError(f"cannot evaluate the annotations of {self.name}: {e}", self.span) from None
            self.state.annotations = cached
        return cached

    def check_output_directions(self, output_names) -> None:
        """Raise if a tensor the caller will read back is annotated In (on the device it reads back as zeros)."""
        from pypto_rt.language.types import TensorType
        annotations = self.annotations()
        bare = [n for n in output_names if isinstance(annotations.get(n), TensorType)
                and annotations[n].direction == "in"]
        if bare:
            raise DSLError(f"{self.name}: output(s) {', '.join(repr(n) for n in bare)} are compared by the golden "
                           "but annotated In (bare pl.Tensor); on the device they would read back as zeros",
                           self.span, "annotate them pl.Out[pl.Tensor[...]], or pl.InOut[...] when the spec has "
                           "an init_value")

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return BoundKernel(self, obj)

    def __repr__(self) -> str:
        return f"<pl.{self.kind} kernel {self.name}>"


class BoundKernel:
    """A `@pl.function` method bound to its `@pl.program` instance."""

    def __init__(self, kernel: KernelFunction, obj: Any):
        self.kernel = kernel
        self.obj = obj

    def __call__(self, *args, **kwargs):
        return self.kernel(self.obj, *args, **kwargs)

    def compile(self, *args, **kwargs):
        return self.kernel.compile(self.obj, *args, **kwargs)

    def check_output_directions(self, output_names) -> None:
        self.kernel.check_output_directions(output_names)


def _decorator(kind: str):
    def deco(fn=None, /, **options):
        if fn is None:
            return lambda f: KernelFunction(f, kind, options)
        return KernelFunction(fn, kind, options)
    deco.__name__ = kind
    deco.__doc__ = f"`@pl.jit.{kind}` / `@pl.jit.{kind}(...)`: a {kind} kernel."
    return deco


class _Jit:
    """`@pl.jit` / `@pl.jit(auto_scope=False)`: an orchestration entry; variants as attributes."""

    inline = staticmethod(_decorator("inline"))
    incore = staticmethod(_decorator("incore"))
    opaque = staticmethod(_decorator("opaque"))
    host = staticmethod(_decorator("host"))
    extern = staticmethod(_decorator("extern"))

    def __call__(self, fn=None, /, **options):
        if fn is None:
            return lambda f: KernelFunction(f, "jit", options)
        return KernelFunction(fn, "jit", options)


jit = _Jit()
inline = _decorator("inline")


def function(fn=None, /, *, type=FunctionType.Opaque, level=None, role=None, attrs=None, auto_scope=None,
             strict_ssa=None, external_source=None):
    """`@pl.function(type=pl.FunctionType.X)`: a function of a `@pl.program` (or standalone)."""
    options = dict(type=type, level=level, role=role, attrs=attrs, auto_scope=auto_scope)
    kind = "inline" if type == FunctionType.Inline else "function"
    if fn is None:
        return lambda f: KernelFunction(f, kind, options)
    return KernelFunction(fn, kind, options)


def program(cls=None, /, *, strict_ssa=None):
    """`@pl.program` class: one program whose `@pl.function` methods call each other via `self`."""
    if cls is None:
        return lambda c: program(c)
    if not inspect.isclass(cls):
        raise DSLError(f"@pl.program decorates a class, got {type(cls).__name__}", user_span(2))
    cls.__pypto_program__ = True
    return cls


def program_entry(program_cls) -> BoundKernel:
    """The entry of a `@pl.program`: its Orchestration function, else its single Opaque one."""
    kernels = {name: k for name, k in vars(program_cls).items() if isinstance(k, KernelFunction)}
    orch = [n for n, k in kernels.items() if k.options.get("type") == FunctionType.Orchestration]
    opaque = [n for n, k in kernels.items() if k.options.get("type") == FunctionType.Opaque]
    chosen = orch or opaque
    if len(chosen) != 1:
        raise DSLError(f"@pl.program {program_cls.__name__} needs exactly one Orchestration function (or one "
                       f"Opaque function) as its entry; found {sorted(kernels)}", None,
                       "mark the entry @pl.function(type=pl.FunctionType.Orchestration)")
    return getattr(program_cls(), chosen[0])
