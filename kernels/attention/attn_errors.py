"""Errors a caller of the attention kernels can cause: one `AttentionArgumentError` (a `PyptoError`) naming the
argument, what it got and what it needs, pointed at the caller's own line."""
import os
import sys

from pypto_rt.errors import PyptoError, Span, is_internal_file

_LIBRARY_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class AttentionArgumentError(PyptoError):
    """A tensor passed to an attention kernel whose shape or dtype does not fit the call."""

    @classmethod
    def at_caller(cls, message: str, hint: str | None = None) -> "AttentionArgumentError":
        return cls(message, _caller_span(), hint)


def _caller_span() -> Span | None:
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (is_internal_file(name) or os.path.abspath(name).startswith(_LIBRARY_DIR)):
            return Span(name, frame.f_lineno)
        frame = frame.f_back
    return None


def describe(value) -> str:
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__
