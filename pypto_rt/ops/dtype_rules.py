"""pl dtype <-> torch storage dtype, and the promotion rule every binary op follows."""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.dtypes import DataType

# Unsigned types wider than 8 bits have no full torch support: store them signed and wider.
_STORAGE = {
    D.FP32: torch.float32, D.BF16: torch.bfloat16, D.FP16: torch.float16,
    D.INT8: torch.int8, D.INT16: torch.int16, D.INT32: torch.int32, D.INT64: torch.int64,
    D.UINT8: torch.uint8, D.UINT16: torch.int32, D.UINT32: torch.int64, D.UINT64: torch.int64,
    D.BOOL: torch.bool, D.INDEX: torch.int64,
    D.FP8E4M3FN: getattr(torch, "float8_e4m3fn", None), D.FP8E5M2: getattr(torch, "float8_e5m2", None),
    D.FP8E8M0: getattr(torch, "float8_e8m0fnu", None),
}
_FROM_TORCH = {
    torch.float32: D.FP32, torch.bfloat16: D.BF16, torch.float16: D.FP16, torch.int8: D.INT8,
    torch.int16: D.INT16, torch.int32: D.INT32, torch.int64: D.INT64, torch.uint8: D.UINT8,
    torch.bool: D.BOOL,
}
for _dt, _t in ((D.FP8E4M3FN, "float8_e4m3fn"), (D.FP8E5M2, "float8_e5m2"), (D.FP8E8M0, "float8_e8m0fnu")):
    if hasattr(torch, _t):
        _FROM_TORCH[getattr(torch, _t)] = _dt


def storage_dtype(dtype: DataType) -> torch.dtype:
    """The torch dtype that holds values of `dtype` on the CPU."""
    t = _STORAGE.get(dtype)
    if t is None:
        raise OpError(f"dtype {dtype!r} has no CPU storage yet (not supported yet: {dtype.name})")
    return t


def from_torch(t: torch.dtype) -> DataType:
    """The pl dtype of a torch tensor crossing the kernel boundary."""
    dt = _FROM_TORCH.get(t)
    if dt is None:
        raise OpError(f"torch dtype {t} cannot be passed to a PyPTO kernel; use one of "
                      f"{sorted(str(k).removeprefix('torch.') for k in _FROM_TORCH)}")
    return dt


def to_dtype(x) -> DataType:
    """Accept a pl DataType or a torch dtype (as some call sites pass)."""
    if isinstance(x, DataType):
        return x
    if isinstance(x, torch.dtype):
        return from_torch(x)
    raise OpError(f"expected a dtype such as pl.FP32, got {x!r}")


def scalar_dtype(v) -> DataType:
    """Literal typing: Python bool -> BOOL, int -> INDEX, float -> FP32."""
    if isinstance(v, bool):
        return D.BOOL
    if isinstance(v, int):
        return D.INDEX
    if isinstance(v, float):
        return D.FP32
    raise OpError(f"expected a number, got {type(v).__name__}")


def promote(a: DataType, b: DataType) -> DataType:
    """PromoteDataTypes: equal -> same; float beats int; else wider; same width -> signed wins."""
    if a == b:
        return a
    if a.is_float() != b.is_float():
        return a if a.is_float() else b
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    if a == D.INDEX or b == D.INDEX:
        return D.INDEX
    if a.is_signed_int() != b.is_signed_int():
        return a if a.is_signed_int() else b
    if a.is_float() and b.is_float():
        return D.FP32 if D.FP32 in (a, b) else a  # BF16 vs FP16: no common 16-bit type
    return a


def lowest(dtype: DataType) -> float | int:
    """Most negative finite value of `dtype` (PadValue.min)."""
    t = storage_dtype(dtype)
    if t.is_floating_point:
        return torch.finfo(t).min
    if t == torch.bool:
        return False
    return _int_range(dtype)[0]


def highest(dtype: DataType) -> float | int:
    """Largest finite value of `dtype` (PadValue.max)."""
    t = storage_dtype(dtype)
    if t.is_floating_point:
        return torch.finfo(t).max
    if t == torch.bool:
        return True
    return _int_range(dtype)[1]


def _int_range(dtype: DataType) -> tuple[int, int]:
    if dtype.is_unsigned_int():
        return 0, (1 << dtype.bits) - 1
    return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1


def int_range(dtype: DataType) -> tuple[int, int]:
    """Representable range of an integer pl dtype (unsigned types by their pl width)."""
    return _int_range(dtype)
