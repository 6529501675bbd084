"""Errors a user of the MoE library can cause; each is a `PyptoError` (rendered with a help line).

`MoEArgumentError.at_caller` points the error at the user's call: the innermost frame outside pypto-rt and
outside this library (whose kernels count as user code to the frontend, so `user_span` would stop here; a
dataclass's generated `__init__` counts as the library's).
"""
from pypto_rt.kernels.library_errors import LibraryError, describe

__all__ = ["MoEError", "MoEConfigError", "MoEArgumentError", "describe"]


class MoEError(LibraryError):
    """Base of the MoE library's user errors."""


class MoEConfigError(MoEError):
    """An `MoEConfig` field, or a world size, that an MoE layer cannot be built with."""


class MoEArgumentError(MoEError):
    """A call's tensor (shape, dtype, token count) that does not match its MoEConfig."""
