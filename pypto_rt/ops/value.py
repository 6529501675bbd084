"""The value every op takes and returns: a torch tensor plus PyPTO metadata.

A `TensorValue` is a PyPTO Tensor (global memory) or Tile (on-chip) value:
- `data`: the torch tensor holding it (storage dtype, see dtype_rules); views alias their source;
- `dtype`: the pl DataType (UINT32 is stored in int64, so the torch dtype alone is not enough);
- `valid`: the origin-anchored valid box, one extent per axis, or None when fully valid.
  Contents outside it are undefined on the device; consumers that can observe them mask.
- `is_tile`: Tile values differ from Tensor values in a few ops (flat tile gather, ...);
- `pad`: the PadValue a view was taken with, used where the box is materialised.
Scalars are plain Python numbers.
"""
from __future__ import annotations

import torch

from pypto_rt.language import _runtime
from pypto_rt.language.dtypes import DataType


class TensorValue:
    __slots__ = ("data", "dtype", "valid", "is_tile", "pad")

    def __init__(self, data: torch.Tensor, dtype: DataType, valid=None, is_tile: bool = False, pad=None):
        self.data = data
        self.dtype = dtype
        self.valid = None if valid is None else normalize_valid(valid, tuple(data.shape))
        self.is_tile = is_tile
        self.pad = pad

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape  # a torch.Size: a tuple subclass, compares and hashes as one

    @property
    def ndim(self) -> int:
        return self.data.dim()

    @property
    def valid_shape(self) -> tuple[int, ...]:
        """The valid extents (the full shape when fully valid)."""
        return self.valid if self.valid is not None else self.shape

    def derive(self, data: torch.Tensor, dtype: DataType | None = None, valid="same", is_tile=None):
        """A new value of the same kind; `valid="same"` keeps this value's box."""
        return TensorValue(
            data, self.dtype if dtype is None else dtype,
            self.valid if valid == "same" else valid,
            self.is_tile if is_tile is None else is_tile,
        )

    # Python syntax used by kernels: subscripts and `t.bind_dynamic(dim, var)`.
    def __getitem__(self, key):
        ex = _runtime.active()
        if ex is not None:
            return ex.call_op("__getitem__", (self, key), {})
        from pypto_rt.ops.views import subscript_read
        return subscript_read(self, key)

    def __setitem__(self, key, value):
        ex = _runtime.active()
        if ex is not None:
            ex.call_op("__setitem__", (self, key, value), {})
            return
        from pypto_rt.ops.views import subscript_write
        subscript_write(self, key, value)

    def bind_dynamic(self, dim: int, var) -> None:
        """Bind axis `dim` to a `pl.dynamic` variable; checked for consistency by the executor."""
        _runtime.current("t.bind_dynamic").bind_dynamic(self, dim, var)

    def __repr__(self) -> str:
        kind = "Tile" if self.is_tile else "Tensor"
        valid = "" if self.valid is None else f", valid={list(self.valid)}"
        return f"{kind}[{list(self.shape)}, {self.dtype!r}{valid}]"

    def __bool__(self):
        raise TypeError("a PyPTO tensor has no truth value; read an element with pl.read(t, [i, ...])")


def broadcast_shape(a, b) -> tuple[int, ...]:
    """numpy/torch broadcasting of two shapes; ValueError when they do not broadcast.

    Written out because torch.broadcast_shapes imports sympy on first use (~280 ms on the first kernel run).
    """
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y:   # (first: equal row counts that follow data compare equal without asking whether they are 1)
            out.append(x)
        elif x != 1 and y != 1:
            raise ValueError(f"shapes {list(a)} and {list(b)} do not broadcast")
        else:
            out.append(y if x == 1 else x)
    return tuple(out)


def normalize_valid(valid, shape: tuple[int, ...]):
    """None when the box covers the whole shape, else a tuple of ints clipped to the shape."""
    if valid is None:
        return None
    if valid == shape:
        return None
    valid = tuple(min(max(int(v), 0), s) for v, s in zip(valid, shape))
    if len(valid) != len(shape):
        raise ValueError(f"valid box {list(valid)} has rank {len(valid)}, shape {list(shape)} has {len(shape)}")
    return None if valid == shape else valid


def valid_mask(value: TensorValue) -> torch.Tensor | None:
    """Boolean mask of the valid box, broadcastable to the value's shape; None when fully valid."""
    if value.valid is None:
        return None
    mask = torch.ones((), dtype=torch.bool)
    for axis, (extent, size) in enumerate(zip(value.valid, value.shape)):
        if extent < size:
            shape = [1] * value.ndim
            shape[axis] = size
            mask = mask & (torch.arange(size) < extent).reshape(shape)
    return mask


def valid_region(value: TensorValue) -> torch.Tensor:
    """The valid box itself, as a view of the data."""
    if value.valid is None:
        return value.data
    return value.data[tuple(slice(0, v) for v in value.valid)]
