"""Parameter annotations: `pl.Tensor[[M, N], pl.FP32]`, `pl.Out[...]`, `pl.Scalar[...]`, `pl.dynamic`.

All of them are subscriptable at import time and produce plain descriptors that the
executors read when binding a kernel's arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pypto_rt.errors import DSLError, user_span
from pypto_rt.language import dtypes
from pypto_rt.language.dtypes import DataType

__all__ = ["DynVar", "dynamic", "TensorType", "ScalarType", "TileType", "ArrayType", "TupleType",
           "Tensor", "Out", "InOut", "Scalar", "Tile", "Array", "Tuple", "TaskId", "TensorView"]


class DynVar:
    """A dynamic extent (`X = pl.dynamic("X")`): the same object in several annotations is one size."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"pl.dynamic({self.name!r})"


def dynamic(name: str) -> DynVar:
    """Declare a dynamic dimension, used in annotations and bound with `t.bind_dynamic(axis, var)`."""
    return DynVar(name)


@dataclass(frozen=True)
class TensorView:
    """Layout view annotation (`pl.TensorView(...)`), accepted and carried."""
    stride: Any = None
    layout: Any = None
    valid_shape: Any = None


@dataclass(frozen=True)
class TensorType:
    """A tensor parameter: shape (ints / DynVars, None when bare), dtype, direction in|out|inout|window."""
    shape: tuple | None
    dtype: DataType | None
    layout: Any = None
    direction: str = "in"


@dataclass(frozen=True)
class TileType:
    shape: tuple | None
    dtype: DataType | None
    memory: Any = None


@dataclass(frozen=True)
class ScalarType:
    dtype: DataType | None


@dataclass(frozen=True)
class ArrayType:
    extent: Any
    dtype: DataType | None


@dataclass(frozen=True)
class TupleType:
    items: tuple


def _shape_dtype(item, what: str):
    if not isinstance(item, tuple) or len(item) not in (2, 3):
        raise DSLError(f"{what}[...] takes [shape, dtype] or [shape, dtype, layout], got {item!r}", user_span(3),
                       f"write {what}[[M, N], pl.FP32]")
    shape, dtype = item[0], item[1]
    if not isinstance(shape, (list, tuple)):
        raise DSLError(f"{what}[...]: the shape must be a list, got {shape!r}", user_span(3))
    if not isinstance(dtype, DataType):
        raise DSLError(f"{what}[...]: the dtype must be a pl dtype such as pl.FP32, got {dtype!r}", user_span(3))
    return tuple(shape), dtype, (item[2] if len(item) == 3 else None)


class _TensorMeta(type):
    def __getitem__(cls, item) -> TensorType:
        shape, dtype, layout = _shape_dtype(item, "pl.Tensor")
        return TensorType(shape, dtype, layout, "in")


class Tensor(metaclass=_TensorMeta):
    """`pl.Tensor[[M, N], dtype]` — a tensor in global memory (an In parameter unless wrapped)."""


class _DirectionMeta(type):
    direction = "in"

    def __getitem__(cls, item):
        if item is Tensor:
            item = TensorType(None, None)
        if not isinstance(item, TensorType):
            raise DSLError(f"pl.{cls.__name__}[...] wraps a pl.Tensor[...] annotation, got {item!r}", user_span(2))
        return replace(item, direction=cls.direction)


class Out(metaclass=_DirectionMeta):
    """`pl.Out[pl.Tensor[...]]` — written by the kernel, in place."""
    direction = "out"


class InOut(metaclass=_DirectionMeta):
    """`pl.InOut[pl.Tensor[...]]` — read and written in place (caches, recurrent state)."""
    direction = "inout"


class _ScalarMeta(type):
    def __getitem__(cls, dtype) -> ScalarType:
        if not isinstance(dtype, DataType):
            raise DSLError(f"pl.Scalar[...] takes a pl dtype, got {dtype!r}", user_span(2))
        return ScalarType(dtype)


class Scalar(metaclass=_ScalarMeta):
    """`pl.Scalar[dtype]` — a by-value scalar parameter."""


class _TileMeta(type):
    def __getitem__(cls, item) -> TileType:
        shape, dtype, memory = _shape_dtype(item, "pl.Tile")
        return TileType(shape, dtype, memory)


class Tile(metaclass=_TileMeta):
    """`pl.Tile[[M, N], dtype]` — an on-chip tile."""


class _ArrayMeta(type):
    def __getitem__(cls, item) -> ArrayType:
        if not isinstance(item, tuple) or len(item) != 2:
            raise DSLError(f"pl.Array[...] takes [extent, dtype], got {item!r}", user_span(2))
        return ArrayType(item[0], item[1])


class Array(metaclass=_ArrayMeta):
    """`pl.Array[extent, dtype]` — a small array (TaskIds or integers)."""


class _TupleMeta(type):
    def __getitem__(cls, item) -> TupleType:
        return TupleType(item if isinstance(item, tuple) else (item,))


class Tuple(metaclass=_TupleMeta):
    """`pl.Tuple[...]` — a tuple of values."""


TaskId = ScalarType(dtypes.TASK_ID)
