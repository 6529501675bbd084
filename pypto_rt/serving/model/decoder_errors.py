"""Errors a user of the decoder can cause, each pointing at the user's line (the innermost frame outside pypto-rt
and outside a dataclass's generated `__init__`)."""
import sys

from pypto_rt.errors import PyptoError, Span, is_internal_file


class DecoderError(PyptoError):
    """A model or a step the decoder cannot run (no KV cache, too many tokens, a missing weight)."""

    @classmethod
    def at_caller(cls, message: str, hint: str | None = None):
        return cls(message, _caller_span(), hint)


class DecoderConfigError(DecoderError):
    """A `DecoderConfig` field the decoder cannot be built with."""


def _caller_span() -> Span | None:
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        generated = name == "<string>" and frame.f_code.co_name == "__init__"
        if not (generated or is_internal_file(name)):
            return Span(name, frame.f_lineno)
        frame = frame.f_back
    return None
