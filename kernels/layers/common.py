"""What the layer kernels share: the row tile, dtype names, argument errors that point at the caller's line.

Every kernel walks token rows in ROW_TILE blocks (the last one partial) and takes whole rows of its operands, so
a decode step is one block per kernel; a call with T = 0 runs no kernel.
"""
import torch

import pypto.language as pl
from pypto_rt.kernels.tile_casts import PL_DTYPES, cast_to, identity
from pypto_rt.kernels.library_errors import LibraryError, describe

ROW_TILE = 64                # token rows per block
COL_TILE_MAX = 1024          # the widest output column block of a linear layer
K_TILE_MAX = 512             # the longest contraction step


class LayerArgumentError(LibraryError):
    """A layer call's tensor (shape, dtype) that the kernel cannot take."""


def check(ok: bool, layer: str, message, hint: str | None = None) -> None:
    """Raise `layer: message` at the caller's line unless `ok`. `message`: a string, or a function making it (the
    hot path's checks pass a lambda, so no error text is built on a call that passes)."""
    if not ok:
        raise LayerArgumentError.at_caller(f"{layer}: {message() if callable(message) else message}", hint)


def check_float(layer: str, name: str, value, dims: int) -> None:
    check(isinstance(value, torch.Tensor) and value.dim() == dims and value.dtype in PL_DTYPES, layer,
          lambda: f"{name} must be a {dims}-D tensor of {', '.join(map(str, PL_DTYPES))}, got {describe(value)}")


def divisor_tile(extent: int, most: int) -> int:
    """The largest divisor of `extent` up to `most` that is a multiple of 16, or the whole extent when none is."""
    return next((k for k in range(min(most, extent) // 16 * 16, 0, -16) if extent % k == 0), extent)


def matmul_bt_walked(k_in: int):
    """The inline `(a [R, K], b [N, K]) -> a @ b^T [R, N] FP32` with K = k_in walked in steps of divisor_tile(K,
    K_TILE_MAX) into one FP32 accumulator (the layers' GEMMs: one rounding, by the caller)."""
    k_step = divisor_tile(k_in, K_TILE_MAX)

    @pl.jit.inline
    def matmul_bt(a, b):
        acc = pl.matmul(a[:, 0:k_step], b[:, 0:k_step], b_trans=True, out_dtype=pl.FP32)
        for k0 in pl.pipeline(k_step, k_in, k_step, stage=2):
            acc = pl.matmul_acc(acc, a[:, k0 : k0 + k_step], b[:, k0 : k0 + k_step], b_trans=True)
        return acc

    return matmul_bt
