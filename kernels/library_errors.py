"""What the kernel libraries' user errors share: `LibraryError.at_caller` points an error at the line of the user's
call, and `describe` shows a bad value in a message.

The caller is the innermost frame outside pypto-rt, outside these libraries (`kernels/`: their DSL kernels count
as user code to the frontend, so `pypto_rt.errors.user_span` would stop inside them) and outside a dataclass's
generated `__init__` (a config's checks run there).
"""
import os
import sys

from pypto_rt.errors import PyptoError, Span, is_internal_file

_LIBRARIES_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class LibraryError(PyptoError):
    """Base of the kernel libraries' errors (MoE, attention, layers) and of the serving model's."""

    @classmethod
    def at_caller(cls, message: str, hint: str | None = None):
        return cls(message, caller_span(), hint)


def caller_span() -> Span | None:
    """Span of the innermost frame on the stack that is the user's (see the module docstring)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        generated = name == "<string>" and frame.f_code.co_name == "__init__"
        if not (generated or is_internal_file(name) or os.path.abspath(name).startswith(_LIBRARIES_DIR)):
            return Span(name, frame.f_lineno)
        frame = frame.f_back
    return None


def describe(value) -> str:
    """A value as an error message shows it: `torch.bfloat16 [4, 32]` for a tensor, else its type's name."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__
