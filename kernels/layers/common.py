"""What the layer kernels share: the row tile, dtype names, argument errors that point at the caller's line.

Every kernel walks token rows in ROW_TILE blocks (the last one partial) and takes whole rows of its operands, so
a decode step is one block per kernel; a call with T = 0 runs no kernel.
"""
import os
import sys

import torch

import pypto.language as pl
from pypto_rt.errors import PyptoError, Span, is_internal_file

ROW_TILE = 64                # token rows per block
COL_TILE_MAX = 1024          # the widest output column block of a linear layer
K_TILE_MAX = 512             # the longest contraction step
PL_DTYPES = {torch.bfloat16: pl.BF16, torch.float16: pl.FP16, torch.float32: pl.FP32}
_LIBRARY_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class LayerArgumentError(PyptoError):
    """A layer call's tensor (shape, dtype) that the kernel cannot take."""

    @classmethod
    def at_caller(cls, message: str, hint: str | None = None) -> "LayerArgumentError":
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
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__


def check(ok: bool, layer: str, message: str, hint: str | None = None) -> None:
    if not ok:
        raise LayerArgumentError.at_caller(f"{layer}: {message}", hint)


def check_float(layer: str, name: str, value, dims: int) -> None:
    check(isinstance(value, torch.Tensor) and value.dim() == dims and value.dtype in PL_DTYPES, layer,
          f"{name} must be a {dims}-D tensor of {', '.join(map(str, PL_DTYPES))}, got {describe(value)}")


def divisor_tile(extent: int, most: int) -> int:
    """The largest divisor of `extent` up to `most` that is a multiple of 16, or the whole extent when none is."""
    return next((k for k in range(min(most, extent) // 16 * 16, 0, -16) if extent % k == 0), extent)


@pl.jit.inline
def _identity(tile):
    return tile


def cast_to(source, target):
    """An inline `tile of source dtype -> target dtype`, rounding to nearest even (the identity when they are the
    same: a same-dtype cast is an error on the device)."""
    if source == target:
        return _identity

    @pl.jit.inline
    def converted(tile):
        return pl.cast(tile, target_type=target, mode="rint")

    return converted
