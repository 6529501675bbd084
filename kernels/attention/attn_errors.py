"""Errors a caller of the attention kernels can cause: one `AttentionArgumentError` (a `PyptoError`) naming the
argument, what it got and what it needs, pointed at the caller's own line; and the argument checks that raise it,
shared by the entry points (`attention_calls`) and the contiguous-cache baseline of benchmark 14."""
import torch

from pypto_rt.kernels.library_errors import LibraryError, describe
from pypto_rt.kernels.tile_casts import PL_DTYPES

__all__ = ["AttentionArgumentError", "describe", "fail", "check_caches", "check_int", "check_new_rows"]


class AttentionArgumentError(LibraryError):
    """A tensor passed to an attention kernel whose shape or dtype does not fit the call."""


def fail(what: str, got, need: str):
    """Raise: argument `what` is `got` (described); it must be `need`."""
    raise AttentionArgumentError.at_caller(f"{what} is {describe(got)}; it must be {need}")


def check_caches(key_cache, value_cache, dtype) -> None:
    """key_cache a 4-d tensor of `dtype`, value_cache shaped like it and of the same dtype."""
    if not isinstance(key_cache, torch.Tensor) or key_cache.dim() != 4:
        fail("key_cache", key_cache, "a tensor [num_blocks, block_size, kv_heads, head_dim]")
    if not isinstance(value_cache, torch.Tensor) or value_cache.shape != key_cache.shape:
        fail("value_cache", value_cache, f"shaped like key_cache {list(key_cache.shape)}")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dtype != dtype:
            fail(name, cache, f"of the dtype of the keys/queries ({dtype})")


def check_int(name: str, t, shape: list, dtypes=(torch.int32,)) -> None:
    """`t` an integer tensor of one of `dtypes`, shaped `shape`."""
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or list(t.shape) != shape:
        fail(name, t, f"{' or '.join(str(d) for d in dtypes)} {shape}")


def check_new_rows(key, value, rows: str) -> None:
    """key [rows, kv_heads, head_dim] of a kernel dtype, value shaped like it: the rows a cache write takes."""
    if not isinstance(key, torch.Tensor) or key.dim() != 3 or key.dtype not in PL_DTYPES:
        fail("key", key, f"a tensor [{rows}, kv_heads, head_dim] of {', '.join(map(str, PL_DTYPES))}")
    if not isinstance(value, torch.Tensor) or value.shape != key.shape or value.dtype != key.dtype:
        fail("value", value, f"shaped like key ({describe(key)})")
