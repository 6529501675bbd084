"""Creation and data movement: create_tensor/tile, full, arange, load/store, move, L1 row builds.

Buffers the device leaves uninitialised (`create_tensor`, `create_tile`) are zeros here; no
golden may depend on that.
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.language.enums import AtomicType, MemorySpace, TensorLayout
from pypto_rt.ops import dtype_rules
from pypto_rt.ops.opdef import ANY_DIM, Shape
from pypto_rt.ops.registry import not_supported, op
from pypto_rt.ops.value import TensorValue
from pypto_rt.ops.views import _ints, _window, _write_box


def _shape(shape, opname):
    shape = _ints(shape, "shape", opname)
    if any(s < 0 for s in shape):
        raise OpError(f"pl.{opname}: negative extent in shape {shape}")
    return shape


def _filled(shape, dtype, value, is_tile, opname):
    dtype = dtype_rules.to_dtype(dtype)
    data = torch.full(_shape(shape, opname), value, dtype=dtype_rules.storage_dtype(dtype))
    return TensorValue(data, dtype, None, is_tile)


# creation ops: the shape is a literal argument, nothing is read (the host runs them without waiting)
_CREATION = dict(shape=Shape.FROM_ARG, shape_arg=(0, "shape"), coalesce=ANY_DIM, waits_on_host=False)


@op("create_tensor", "tensor.create", "tensor.create_tensor", **_CREATION)
def create_tensor(shape, dtype, layout=TensorLayout.ND, manual_dep=False, init_value=None):
    return _filled(shape, dtype, 0 if init_value is None else init_value, False, "create_tensor")


@op("full", "tensor.full", **_CREATION)
def full(shape, dtype, value):
    return _filled(shape, dtype, value, False, "full")


@op("tile.full", **_CREATION)
def tile_full(shape, dtype, value):
    return _filled(shape, dtype, value, True, "tile.full")


@op("create_tile", "tile.create", "tile.create_tile", **_CREATION)
def create_tile(shape, dtype, target_memory=MemorySpace.Vec, transpose=None, *, flat_layout=None):
    return _filled(shape, dtype, 0, True, "create_tile")


@op("create_l1", "tile.create_l1")
def create_l1(shape, dtype, transpose=False):
    return _filled(shape, dtype, 0, True, "create_l1")


def _arange(start, shape, dtype, descending, is_tile, opname):
    shape = _shape(shape, opname)
    if any(s != 1 for s in shape[:-1]):
        raise OpError(f"pl.{opname}: only the first row is generated; leading extents must be 1, got {shape}")
    dtype = dtype_rules.to_dtype(dtype)
    n = shape[-1]
    steps = torch.arange(n, dtype=torch.int64)
    vals = int(start) - steps if descending else int(start) + steps
    if dtype.is_float():
        vals = vals.double()
    return TensorValue(vals.to(dtype_rules.storage_dtype(dtype)).reshape(shape), dtype, None, is_tile)


@op("arange", "tensor.arange", "tensor.ci", waits_on_host=False)
def arange(start, shape, dtype=None, descending=False):
    from pypto_rt.language.dtypes import INT32
    return _arange(start, shape, dtype or INT32, descending, False, "arange")


@op("tile.arange", "tile.ci", waits_on_host=False)
def tile_arange(start, shape, dtype=None, descending=False):
    from pypto_rt.language.dtypes import INT32
    return _arange(start, shape, dtype or INT32, descending, True, "tile.arange")


@op("tri", "tile.tri", waits_on_host=False)
def tri(diagonal, shape, valid_shape=None, dtype=None, upper=False):
    from pypto_rt.language.dtypes import INT32
    dtype = dtype_rules.to_dtype(dtype or INT32)
    shape = _shape(shape, "tri")
    i = torch.arange(shape[-2]).reshape(-1, 1)
    j = torch.arange(shape[-1]).reshape(1, -1)
    mask = (j >= i + int(diagonal)) if upper else (j <= i + int(diagonal))
    data = mask.expand(shape).to(dtype_rules.storage_dtype(dtype)).clone()
    return TensorValue(data, dtype, valid_shape, True)


@op("expands", "tensor.expands", "tile.expands", shape=Shape.SAME, coalesce=ANY_DIM,
    waits_on_host=False)
def expands(target, scalar):
    if not target.dtype.is_float():
        scalar = int(scalar)
    return TensorValue(torch.full(target.shape, scalar, dtype=target.data.dtype), target.dtype, target.valid,
                       target.is_tile)


@op("expand_clone", "tensor.expand_clone", "tile.expand_clone")
def expand_clone(src, target):
    try:
        data = src.data.expand(target.shape).clone()
    except RuntimeError:
        raise OpError(f"pl.expand_clone: {list(src.shape)} does not broadcast to {list(target.shape)}") from None
    return TensorValue(data, src.dtype, None, src.is_tile)


@op("load", "tile.load", shape=Shape.FROM_ARG, shape_arg=(2, "shapes"), offset_arg=(1, "offsets"),
    coalesce=ANY_DIM)
def load(tensor, offsets, shapes, valid_shape=None, target_memory=MemorySpace.Vec, clamp=False):
    win = _window(tensor, shapes, offsets, "load")
    valid = win.valid_shape
    if valid_shape is not None:
        valid = tuple(min(a, int(b)) for a, b in zip(valid, valid_shape))
    data = torch.zeros(win.shape, dtype=win.data.dtype)
    data[tuple(slice(0, v) for v in valid)] = win.data[tuple(slice(0, v) for v in valid)]
    return TensorValue(data, tensor.dtype, valid, True)


@op("store", "tile.store", offset_arg=(1, "offsets"), coalesce=ANY_DIM, writes="output_tensor")
def store(tile, offsets, output_tensor, shapes=None, *, atomic=AtomicType.None_):
    _write_box(output_tensor, tile, offsets, "pl.store", atomic)
    return output_tensor


@op("move", "tile.move", shape=Shape.SAME, coalesce=ANY_DIM)
def move(tile, target_memory=None, blayout=None, slayout=None):
    return tile


@op("gather_row", "tile.gather_row", "tensor.gather_row", writes="acc")
def gather_row(acc, src, dst_offset, src_offset, shapes, transpose=False, *, valid_shape=None):
    shapes = _shape(shapes, "gather_row")
    piece = _window(src, shapes, src_offset, "gather_row")
    if valid_shape is not None:
        piece = TensorValue(piece.data, piece.dtype, tuple(min(a, int(b)) for a, b in zip(piece.valid_shape,
                                                                                          valid_shape)), True)
    if transpose:
        piece = TensorValue(piece.data.mT, piece.dtype, tuple(reversed(piece.valid_shape)), True)
    _write_box(acc, piece, dst_offset, "pl.gather_row", AtomicType.None_)
    return acc


not_supported("random", "tile.random", why="counter-based RNG; no bit-exact CPU model")
