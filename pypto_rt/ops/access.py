"""Scalar element access: pl.read / pl.write."""
from __future__ import annotations

from pypto_rt.errors import OpError
from pypto_rt.ops import recording
from pypto_rt.ops.recording import integral
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue


def _index(src: TensorValue, indices, opname: str) -> tuple[int, ...]:
    if not isinstance(indices, (list, tuple)):
        indices = [indices]
    try:
        idx = tuple(integral(i) for i in indices)
    except (TypeError, ValueError):
        raise OpError(f"pl.{opname}: indices must be integers, got {indices!r}") from None
    if len(idx) != src.ndim:
        raise OpError(f"pl.{opname}: {len(idx)} indices for a rank-{src.ndim} tensor of shape {list(src.shape)}",
                      hint="give one index per axis, e.g. pl.read(t, [i, j])")
    for axis, (i, n) in enumerate(zip(idx, src.shape)):
        if not 0 <= i < n:
            raise OpError(f"pl.{opname}: index {i} out of range on axis {axis} (extent {n}) of "
                          f"shape {list(src.shape)}")
    return idx


def _to_python(v, dtype):
    if dtype.is_float():
        return float(v)
    if dtype.name == "BOOL":
        return bool(v)
    return int(v)


@op("read", "tensor.read", "tile.read", reads_data=True)
def read(src, indices):
    # while a run is recorded for replay, the element may come as a number read from data
    # (recording.ScalarFromData), which the replay reads again
    index = _index(src, indices, "read")
    if recording.recording() and src.dtype.name != "BOOL" and src.data.is_floating_point() == src.dtype.is_float():
        traced = recording.read_scalar(src.data, index)
        if traced is not None:
            return traced
        index = tuple(int(i) for i in index)
    return _to_python(src.data[index].item(), src.dtype)


@op("write", "tensor.write", "tile.write", writes="dst")
def write(dst, indices, value):
    dst.data[_index(dst, indices, "write")] = value
    return dst
