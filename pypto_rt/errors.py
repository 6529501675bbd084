"""Errors a user can cause, rendered at the user's own source line.

Every user-facing error subclasses `PyptoError`. Its text reads::

    error: <what is wrong>
     --> kernel.py:12:8
       |
    12 |     y[r : r + 8, :] = pl.add(tile, a)
       |                       ^^^^^^^^^^^^^^^
       = help: <what to do>

Imports nothing from the rest of pypto_rt.
"""
from __future__ import annotations

import linecache
import os
import sys
import types
from dataclasses import dataclass

_PKG_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (__file__, os.path.join(os.path.dirname(__file__), "..", "pypto", "__init__.py"))
)


def is_internal_file(filename: str) -> bool:
    """True for frames of pypto_rt and of the `pypto` shim package (never the user's code)."""
    path = os.path.abspath(filename)
    return path.startswith(_PKG_DIRS) or filename.startswith("<frozen ")


@dataclass(frozen=True)
class Span:
    """A place in the user's source: 1-based line, 0-based columns."""
    file: str
    line: int
    col: int = 0
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col + 1}"


class PyptoError(Exception):
    """Base of every error a user can cause. `span` names the user's line, `hint` what to do."""

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def at(self, span: Span | None) -> "PyptoError":
        """Attach a span unless one is already known; returns self for `raise err.at(span)`."""
        if self.span is None:
            self.span = span
        return self

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        lines = [f"error: {self.message}"]
        if self.span is not None:
            lines.append(f" --> {self.span}")
            lines.extend(_snippet(self.span))
        if self.hint:
            lines.append(f"   = help: {self.hint}")
        return "\n".join(lines)


class DSLError(PyptoError):
    """Misuse of the `pl` language: a construct in the wrong place, a bad annotation."""


class OpError(PyptoError):
    """An op called with arguments it cannot take (shape, dtype, rank, value)."""


class UnknownOpError(PyptoError, AttributeError):
    """`pl.<name>` that the language does not define."""


class NotSupportedError(PyptoError):
    """A real PyPTO feature that this runtime does not implement yet."""


class RealPyptoOnlyError(PyptoError, ModuleNotFoundError):
    """An import of a `pypto.*` module that only the real PyPTO stack has (`pypto.runtime`, `pypto.backend`,
    ...). Still a ModuleNotFoundError, so `try: import pypto.runtime except ImportError:` keeps working."""


class OutsideKernelError(PyptoError):
    """A `pl` op or scope used in plain Python, outside any running kernel."""


class KernelArgumentError(PyptoError):
    """A `@pl.jit` call whose arguments do not match the kernel's parameters."""


class PlatformError(PyptoError):
    """A platform or backend that this machine cannot provide."""


class InWriteWarning(UserWarning):
    """A kernel wrote into a tensor parameter annotated In: fine as scratch, lost as a result on the device."""


class EntryShapeWarning(UserWarning):
    """An entry tensor whose shape differs from its static annotation: the call runs for the shape passed."""


class StyleWarning(UserWarning):
    """Code the real compiler accepts but the style guide places elsewhere (e.g. `pl.parallel` inside a
    `pl.at` body); it runs as the real compiler runs it."""


def _snippet(span: Span) -> list[str]:
    text = linecache.getline(span.file, span.line).rstrip("\n")
    if not text:
        return []
    gutter = " " * len(str(span.line))
    end = span.end_col if span.end_col and span.end_col > span.col else len(text)
    marks = " " * span.col + "^" * max(1, end - span.col)
    return [f"{gutter} |", f"{span.line} | {text}", f"{gutter} | {marks}"]


def user_span(depth: int = 1) -> Span | None:
    """Span of the innermost frame on the current stack that is the user's code."""
    frame = sys._getframe(depth)
    while frame is not None:
        if not is_internal_file(frame.f_code.co_filename):
            return _frame_span(frame, frame.f_lineno, frame.f_lasti)
        frame = frame.f_back
    return None


def span_from_traceback(tb: types.TracebackType | None) -> Span | None:
    """Span of the innermost user frame in a traceback."""
    found = None
    while tb is not None:
        if not is_internal_file(tb.tb_frame.f_code.co_filename):
            found = _frame_span(tb.tb_frame, tb.tb_lineno, tb.tb_lasti)
        tb = tb.tb_next
    return found


def _frame_span(frame, lineno: int, lasti: int) -> Span:
    col, end_col = 0, None
    try:
        positions = list(frame.f_code.co_positions())
        pos = positions[lasti // 2] if lasti >= 0 else None
        if pos and pos[0] == lineno and pos[2] is not None:
            col = pos[2]
            end_col = pos[3] if pos[1] == lineno else None
    except (AttributeError, IndexError, ValueError):
        pass
    return Span(frame.f_code.co_filename, lineno, col, end_col)


def strip_internal_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """A copy of `tb` without pypto_rt's own frames (set PYPTO_FRONTEND_DEBUG=1 to keep them)."""
    from pypto_rt import knobs   # (knobs imports this module)
    if knobs.FRONTEND_DEBUG.on():
        return tb
    frames = []
    while tb is not None:
        if not is_internal_file(tb.tb_frame.f_code.co_filename):
            frames.append(tb)
        tb = tb.tb_next
    new_tb = None
    for old in reversed(frames):
        new_tb = types.TracebackType(new_tb, old.tb_frame, old.tb_lasti, old.tb_lineno)
    return new_tb


def error_chain(exc: BaseException | None):
    """The exceptions of `exc`'s chain, `exc` first: breadth first through `.error` (a failed task's own error),
    `__cause__` and `__context__`, each yielded once."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [getattr(e, "error", None), e.__cause__, e.__context__]


def find_wait(exc: BaseException | None) -> dict | None:
    """The `.wait` dict (a communication wait's report) of the first exception in `exc`'s chain that has one."""
    return next((e.wait for e in error_chain(exc) if isinstance(getattr(e, "wait", None), dict)), None)
