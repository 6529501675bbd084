"""Errors a user of the decoder can cause, each pointing at the user's line (`LibraryError.at_caller`)."""
from pypto_rt.kernels.library_errors import LibraryError


class DecoderError(LibraryError):
    """A model or a step the decoder cannot run (no KV cache, too many tokens, a missing weight)."""


class DecoderConfigError(DecoderError):
    """A `DecoderConfig` field the decoder cannot be built with."""
