"""The one bridge from the `pl` surface to whatever executes a kernel.

Language objects (op stubs, loops, scopes, kernel calls) describe; the active executor runs.
`current()` is that executor; outside a running kernel it raises OutsideKernelError.
The executor sets itself with `activate(executor)` for the duration of a kernel call.
"""
from __future__ import annotations

import contextvars
from typing import Any, Iterator, Protocol

from pypto_rt.errors import OutsideKernelError, user_span


class Executor(Protocol):
    """What the language needs from an executor (reference or compiled; pypto_rt.executor_base implements it)."""

    def call_op(self, name: str, args: tuple, kwargs: dict) -> Any: ...
    def iterate(self, loop: Any) -> Iterator: ...
    def enter_scope(self, scope: Any) -> Any: ...
    def exit_scope(self, scope: Any, failed: bool) -> None: ...
    def call_kernel(self, fn: Any, args: tuple, kwargs: dict) -> Any: ...
    def yield_(self, values: tuple) -> Any: ...
    def bind_dynamic(self, value: Any, dim: int, var: Any) -> None: ...


_active: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("pypto_executor", default=None)


def current(what: str = "this") -> Executor:
    ex = _active.get()
    if ex is None:
        raise OutsideKernelError(
            f"{what} can only run inside a PyPTO kernel",
            user_span(2),
            "call it from the body of a @pl.jit function (or a @pl.jit.inline one it calls)",
        )
    return ex


def active() -> Executor | None:
    return _active.get()


class activate:  # noqa: N801 - used as a function: `with activate(executor):`
    """Make `executor` the active one for a with block (a class: a kernel block pays for this on every task)."""
    __slots__ = ("executor", "token")

    def __init__(self, executor: Executor):
        self.executor = executor

    def __enter__(self) -> Executor:
        self.token = _active.set(self.executor)
        return self.executor

    def __exit__(self, *exc) -> None:
        _active.reset(self.token)
