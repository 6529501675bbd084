"""Errors a user of the MoE library can cause; each is a `PyptoError` (rendered with a help line).

`MoEArgumentError.at_caller` points the error at the user's call: the innermost frame outside pypto-rt and
outside this library (whose kernels count as user code to the frontend, so `user_span` would stop here; a
dataclass's generated `__init__` counts as the library's).
"""
import os
import sys

from pypto_rt.errors import PyptoError, Span, is_internal_file

_LIBRARY_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class MoEError(PyptoError):
    """Base of the MoE library's user errors."""


class MoEConfigError(MoEError):
    """An `MoEConfig` field, or a world size, that an MoE layer cannot be built with."""


class MoEArgumentError(MoEError):
    """A call's tensor (shape, dtype, token count) that does not match its MoEConfig."""

    @classmethod
    def at_caller(cls, message: str, hint: str | None = None) -> "MoEArgumentError":
        return cls(message, caller_span(), hint)


def caller_span() -> Span | None:
    """Span of the innermost frame on the stack that is neither pypto-rt's nor this library's."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        generated = name == "<string>" and frame.f_code.co_name == "__init__"   # a dataclass's __init__
        if not (generated or is_internal_file(name) or os.path.abspath(name).startswith(_LIBRARY_DIR)):
            return Span(name, frame.f_lineno)
        frame = frame.f_back
    return None


def describe(value) -> str:
    """A value as an error message shows it: `torch.bfloat16 [4, 32]` for a tensor, else its type's name."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__
