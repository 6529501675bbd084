"""Errors a caller of the attention kernels can cause: one `AttentionArgumentError` (a `PyptoError`) naming the
argument, what it got and what it needs, pointed at the caller's own line."""
from pypto_rt.kernels.library_errors import LibraryError, describe

__all__ = ["AttentionArgumentError", "describe"]


class AttentionArgumentError(LibraryError):
    """A tensor passed to an attention kernel whose shape or dtype does not fit the call."""
