"""Views and shape ops: slice, subscripts, assemble, reshape, transpose, concat, valid boxes, fillpad.

Aliasing rules (pl_api.md §3.2): `pl.reshape` and in-bounds slices are torch views of their
source, so writes through them land in the source. A window that runs past its source is a
zero-padded copy whose valid box is clipped to the source. Writes (assemble, subscript
assignment) store only the source value's valid box.
"""
from __future__ import annotations

import math

import torch

from pypto_rt.errors import OpError
from pypto_rt.language.enums import AtomicType, PadValue
from pypto_rt.ops import dtype_rules
from pypto_rt.ops.accumulate import atomic_add_
from pypto_rt.ops.opdef import ANY_DIM, ROWS, Shape
from pypto_rt.ops.recording import integral, is_int
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue, valid_mask, valid_region

def _ints(seq, what: str, opname: str) -> list[int]:
    try:
        return [integral(v) for v in seq]
    except (TypeError, ValueError):
        raise OpError(f"pl.{opname}: {what} must be a list of integers, got {seq!r}") from None


def _window(x: TensorValue, shape, offset, opname: str) -> TensorValue:
    """The [offset, offset+shape) window of x: a view when in bounds, else a zero-padded copy."""
    shape, offset = _ints(shape, "shape", opname), _ints(offset, "offset", opname)
    if len(shape) != x.ndim or len(offset) != x.ndim:
        raise OpError(f"pl.{opname}: shape {shape} and offset {offset} must both have rank {x.ndim} "
                      f"(the source is {list(x.shape)})")
    if any(s < 0 for s in shape) or any(o < 0 for o in offset):
        raise OpError(f"pl.{opname}: negative shape {shape} or offset {offset}")
    src_valid = x.valid_shape
    valid = tuple(max(0, min(v - o, s)) for v, o, s in zip(src_valid, offset, shape))
    if all(o + s <= n for o, s, n in zip(offset, shape, x.shape)):
        data = x.data[tuple(slice(o, o + s) for o, s in zip(offset, shape))]
    else:
        data = torch.zeros(shape, dtype=x.data.dtype)
        inside = tuple(max(0, min(s, n - o)) for o, s, n in zip(offset, shape, x.shape))
        data[tuple(slice(0, e) for e in inside)] = x.data[tuple(slice(o, o + e) for o, e in zip(offset, inside))]
        valid = tuple(min(v, e) for v, e in zip(valid, inside))
    return TensorValue(data, x.dtype, valid, x.is_tile, x.pad)


@op("slice", "tensor.slice", "tile.slice", shape=Shape.FROM_ARG, shape_arg=(1, "shape"), offset_arg=(2, "offset"),
    coalesce=ANY_DIM, waits_on_host=False, is_view=True)
def slice_(x, shape, offset, valid_shape=None, drop_dims=None, pad_value=None, clamp=False):
    out = _window(x, shape, offset, "slice")
    if valid_shape is not None:
        narrowed = _ints(valid_shape, "valid_shape", "slice")
        if len(narrowed) != out.ndim:
            raise OpError(f"pl.slice: valid_shape {narrowed} must have rank {out.ndim}")
        out = TensorValue(out.data, out.dtype, tuple(min(a, b) for a, b in zip(out.valid_shape, narrowed)),
                          out.is_tile, out.pad)
    if pad_value is not None:
        out.pad = pad_value
    if drop_dims:
        out = _drop_axes(out, [int(d) % out.ndim for d in drop_dims], "slice")
    return out


def _drop_axes(x: TensorValue, axes, opname: str) -> TensorValue:
    for a in axes:
        if x.shape[a] != 1:
            raise OpError(f"pl.{opname}: cannot drop axis {a} of extent {x.shape[a]} (only unit axes)")
    keep = [a for a in range(x.ndim) if a not in axes]
    data = x.data.reshape([x.shape[a] for a in keep]) if keep else x.data.reshape([])
    return TensorValue(data, x.dtype, [x.valid_shape[a] for a in keep], x.is_tile, x.pad)


def _parse_key(x: TensorValue, key, opname: str):
    """Subscript key -> (shape, offset, axes indexed by a scalar)."""
    key = key if isinstance(key, tuple) else (key,)
    if len(key) > x.ndim:
        raise OpError(f"{opname}: {len(key)} indices for a rank-{x.ndim} value of shape {list(x.shape)}")
    shape, offset, scalar_axes = [], [], []
    for axis, size in enumerate(x.shape):
        k = key[axis] if axis < len(key) else slice(None)
        if isinstance(k, slice):
            if k.step not in (None, 1):
                raise OpError(f"{opname}: slices with a step are not supported (axis {axis})",
                              hint="PyPTO windows are contiguous; gather the strided elements instead")
            start = 0 if k.start is None else integral(k.start)
            stop = size if k.stop is None else integral(k.stop)
            if start < 0 or stop < start:
                raise OpError(f"{opname}: bad window {start}:{stop} on axis {axis} of extent {size}")
            shape.append(stop - start)
            offset.append(start)
        else:
            try:
                idx = integral(k)
            except (TypeError, ValueError):
                raise OpError(f"{opname}: index on axis {axis} must be an integer or a slice, got {k!r}") from None
            shape.append(1)
            offset.append(idx)
            scalar_axes.append(axis)
    return shape, offset, scalar_axes


def _in_bounds_slices(key, shape) -> bool:
    """The common case of a subscript: only unit-step slices with int bounds inside `shape` (no padding, no
    dropped axes), where the window is a plain torch view."""
    if len(key) > len(shape):
        return False
    for k, n in zip(key, shape):
        if type(k) is not slice or k.step not in (None, 1):
            return False
        # (as plain numbers: the recorder guards a traced window's bounds itself, or checks a late row count's in
        # line, and pins a window outside its tensor; guarding here too would refuse a late row count)
        start = int.__int__(k.start) if isinstance(k.start, int) else k.start
        stop = int.__int__(k.stop) if isinstance(k.stop, int) else k.stop
        if (start is not None and (not is_int(start) or start < 0)) or \
                (stop is not None and (not is_int(stop) or stop > n)) or \
                (start is not None and stop is not None and stop < start):
            return False
    return True


@op("__getitem__", waits_on_host=False)
def subscript_read(x: TensorValue, key):
    key = key if isinstance(key, tuple) else (key,)
    if x.valid is None and _in_bounds_slices(key, x.data.shape):   # fast path, same result as the window below
        return TensorValue(x.data[key], x.dtype, None, x.is_tile, x.pad)
    shape, offset, scalar_axes = _parse_key(x, key, "subscript")
    if len(scalar_axes) == x.ndim:
        from pypto_rt.ops.access import read
        return read(x, offset)
    out = _window(x, shape, offset, "subscript")
    if x.is_tile:
        scalar_axes = scalar_axes[: max(0, out.ndim - 2)]
    return _drop_axes(out, scalar_axes, "subscript") if scalar_axes else out


@op("__setitem__", writes="dst")
def subscript_write(dst: TensorValue, key, src) -> None:
    key = key if isinstance(key, tuple) else (key,)
    if (isinstance(src, TensorValue) and src.valid is None and len(key) == src.data.dim() == dst.data.dim()
            and _in_bounds_slices(key, dst.data.shape)):
        window = dst.data[key]
        if window.shape == src.data.shape:   # fast path: a fully valid source filling the whole window
            window.copy_(src.data if src.data.dtype == window.dtype else src.data.to(window.dtype))
            return
    shape, offset, scalar_axes = _parse_key(dst, key, "subscript assignment")
    if any(o >= n and s > 0 for o, s, n in zip(offset, shape, dst.shape)):
        raise OpError(f"subscript assignment: window at {offset} of shape {shape} starts outside the target "
                      f"{list(dst.shape)}")
    # a window running past the target's end is clipped: only src's valid box is written, and it must fit
    shape = [min(s, n - o) for o, s, n in zip(offset, shape, dst.shape)]
    window = _window(dst, shape, offset, "subscript assignment")
    if not isinstance(src, TensorValue):
        window.data.fill_(src)
        return
    if scalar_axes:
        window = _drop_axes(window, scalar_axes, "subscript assignment")
    _write_box(window, src, [0] * window.ndim, "subscript assignment", AtomicType.None_)


def _match_rank(src: TensorValue, ndim: int, opname: str) -> TensorValue:
    while src.ndim > ndim and src.shape[0] == 1:
        src = _drop_axes(src, [0], opname)
    while src.ndim < ndim:
        src = TensorValue(src.data.unsqueeze(0), src.dtype, (1, *src.valid_shape), src.is_tile)
    if src.ndim != ndim:
        raise OpError(f"{opname}: source of shape {list(src.shape)} cannot be written into a rank-{ndim} target")
    return src


def _write_box(target: TensorValue, src: TensorValue, offset, opname: str, atomic) -> None:
    src = _match_rank(src, target.ndim, opname)
    box = src.valid_shape
    offset = _ints(offset, "offset", opname)
    if len(offset) != target.ndim:
        raise OpError(f"{opname}: offset {offset} must have rank {target.ndim}")
    if any(o < 0 or o + b > n for o, b, n in zip(offset, box, target.shape)):
        raise OpError(f"{opname}: writing a {list(box)} box at offset {offset} runs past the target "
                      f"{list(target.shape)}", hint="check the offset and the source's shape")
    region = target.data[tuple(slice(o, o + b) for o, b in zip(offset, box))]
    values = valid_region(src).to(region.dtype)
    if int(atomic) == int(AtomicType.Add):
        atomic_add_(region, values)
    else:
        region.copy_(values)


@op("assemble", "tensor.assemble", "tile.assemble", shape=Shape.FIRST, offset_arg=(2, "offset"), coalesce=ANY_DIM,
    writes="target")
def assemble(target, source, offset, *, atomic=AtomicType.None_):
    if not isinstance(source, TensorValue):
        raise OpError(f"pl.assemble: source must be a tensor or tile, got {type(source).__name__}")
    _write_box(target, source, offset, "pl.assemble", atomic)
    return target


@op("reshape", "tensor.reshape", "tile.reshape", shape=Shape.FROM_ARG, shape_arg=(1, "shape"), coalesce=ROWS,
    waits_on_host=False, is_view=True)
def reshape(x, shape):
    shape = _ints(shape, "shape", "reshape")
    if math.prod(shape) != x.data.numel() and -1 not in shape:
        raise OpError(f"pl.reshape: cannot reshape {list(x.shape)} ({x.data.numel()} elements) to {shape}")
    data = x.data.reshape(shape)   # a view where one exists; a non-viewable window: a copy (writes through it stay
                                   # local). Not view() then reshape(): a failed view raises (~20 us per call)
    return TensorValue(data, x.dtype, _remap_valid(x, tuple(data.shape)), x.is_tile, x.pad)


def _remap_valid(x: TensorValue, new_shape):
    mask = valid_mask(x)
    if mask is None:
        return None
    mask = mask.expand(x.shape).reshape(new_shape)
    extents = []
    for axis in range(len(new_shape)):
        other = tuple(a for a in range(len(new_shape)) if a != axis)
        hit = mask.any(dim=other) if other else mask
        nz = torch.nonzero(hit)
        extents.append(int(nz.max()) + 1 if nz.numel() else 0)
    box = torch.zeros(new_shape, dtype=torch.bool)
    box[tuple(slice(0, e) for e in extents)] = True
    if not torch.equal(box, mask):
        raise OpError(f"pl.reshape: the valid box {list(x.valid)} of {list(x.shape)} is not a box in {list(new_shape)}",
                      hint="fillpad the value first, or reshape along whole rows")
    return tuple(extents)


@op("transpose", "tensor.transpose", "tile.transpose")
def transpose(x, axis1, axis2, tmp_tile=None):
    a, b = int(axis1) % x.ndim, int(axis2) % x.ndim
    if a == b:
        raise OpError(f"pl.transpose: axis1 and axis2 are the same axis ({axis1}, {axis2})")
    valid = list(x.valid_shape)
    valid[a], valid[b] = valid[b], valid[a]
    return TensorValue(x.data.transpose(a, b).contiguous(), x.dtype, valid, x.is_tile)


@op("tile.transpose_view", waits_on_host=False, is_view=True)
def transpose_view(x):
    valid = list(x.valid_shape)
    valid[-1], valid[-2] = valid[-2], valid[-1]
    return TensorValue(x.data.mT, x.dtype, valid, x.is_tile)


@op("concat", "tensor.concat", "tile.concat")
def concat(a, b):
    if a.shape[:-1] != b.shape[:-1]:
        raise OpError(f"pl.concat: shapes {list(a.shape)} and {list(b.shape)} differ outside the last axis")
    dtype = dtype_rules.promote(a.dtype, b.dtype)
    t = dtype_rules.storage_dtype(dtype)
    return TensorValue(torch.cat([a.data.to(t), b.data.to(t)], dim=-1), dtype, None, a.is_tile)


@op("reinterpret_view", "tensor.reinterpret_view", "tile.reinterpret_view", waits_on_host=False, is_view=True)
def reinterpret_view(x, dtype, *, shape=None):
    dtype = dtype_rules.to_dtype(dtype)
    data = bits_as(x.data, x.dtype, dtype)
    if shape is not None:
        data = data.reshape(_ints(shape, "shape", "reinterpret_view"))
    return TensorValue(data, dtype, None, x.is_tile)


def bits_as(data: torch.Tensor, src, dst) -> torch.Tensor:
    """Bit reinterpretation between pl dtypes, honouring storage widening of wide unsigned types."""
    raw = {32: torch.int32, 16: torch.int16, 64: torch.int64, 8: torch.int8}
    if dtype_rules.storage_dtype(src).itemsize * 8 != src.bits:
        data = data.to(raw[src.bits])
    out_t = dtype_rules.storage_dtype(dst)
    if out_t.itemsize * 8 != dst.bits:
        return data.view(raw[dst.bits]).to(out_t) & ((1 << dst.bits) - 1)
    return data.view(out_t)


@op("set_validshape", "tensor.set_validshape", "tile.set_validshape", shape=Shape.SAME, coalesce=ANY_DIM,
    waits_on_host=False)
def set_validshape(x, valid_rows, valid_cols):
    if x.ndim != 2:
        raise OpError(f"pl.set_validshape: needs a 2-D value, got shape {list(x.shape)}")
    return TensorValue(x.data, x.dtype, (int(valid_rows), int(valid_cols)), x.is_tile, x.pad)


def pad_scalar(pad_value, dtype):
    """The element a PadValue (or its sugar 0 / ±math.inf) stands for in `dtype`."""
    if pad_value is None or pad_value == PadValue.null:
        pad_value = PadValue.zero
    if isinstance(pad_value, PadValue):
        return {PadValue.zero: 0, PadValue.min: dtype_rules.lowest(dtype),
                PadValue.max: dtype_rules.highest(dtype)}[pad_value]
    if isinstance(pad_value, (int, float)):
        if pad_value == -math.inf:
            return dtype_rules.lowest(dtype)
        if pad_value == math.inf:
            return dtype_rules.highest(dtype)
        if pad_value == 0:
            return 0
    raise OpError(f"pad_value must be a pl.PadValue, 0, math.inf or -math.inf, got {pad_value!r}")


@op("fillpad", "tensor.fillpad", "tile.fillpad", shape=Shape.SAME, coalesce=ANY_DIM)
def fillpad(x, pad_value=PadValue.zero):
    fill = pad_scalar(pad_value, x.dtype)
    mask = valid_mask(x)
    data = x.data.clone() if mask is None else torch.where(mask, x.data, torch.full((), fill, dtype=x.data.dtype))
    return TensorValue(data, x.dtype, None, x.is_tile)


@op("fillpad_inplace", "tile.fillpad_inplace", "tensor.fillpad_inplace", shape=Shape.SAME, coalesce=ANY_DIM, writes="x")
def fillpad_inplace(x, pad_value=PadValue.zero):
    mask = valid_mask(x)
    if mask is not None:
        x.data.masked_fill_(~mask.expand(x.shape), pad_scalar(pad_value, x.dtype))
        x.valid = None
    return x


@op("fillpad_expand", "tensor.fillpad_expand", "tile.fillpad_expand")
def fillpad_expand(x, shape, pad_value=PadValue.zero):
    shape = _ints(shape, "shape", "fillpad_expand")
    box = x.valid_shape
    if len(shape) != x.ndim or any(b > s for b, s in zip(box, shape)):
        raise OpError(f"pl.fillpad_expand: valid box {list(box)} does not fit in {shape}")
    data = torch.full(shape, pad_scalar(pad_value, x.dtype), dtype=x.data.dtype)
    data[tuple(slice(0, b) for b in box)] = valid_region(x)
    return TensorValue(data, x.dtype, None, x.is_tile)


@op("dim", "tensor.dim", "tile.dim", waits_on_host=False)
def dim(t, axis):
    if not -t.ndim <= int(axis) < t.ndim:
        raise OpError(f"pl.tensor.dim: axis {axis} out of range for shape {list(t.shape)}")
    return int(t.shape[int(axis)])
