"""`pl.cast` and `pl.const`: dtype conversion with the hardware's rounding modes (spec §4.4, §3.5).

Modes (name, int or `CastMode`): none (no rounding; where precision is lost it rounds like rint), rint (nearest,
ties to even), round (the DEFAULT: nearest, ties away from zero), floor, ceil, trunc, odd (nearest, ties to odd).
Float -> int rounds in float64 and then saturates to the target range (NaN -> 0); int -> int saturates too.
Float/int -> BF16/FP16/FP32 rounds exactly once with the requested mode: the candidate neighbours are found from
torch's RNE result by stepping the bit pattern, so ties (e.g. FP32 -> BF16 with low half 0x8000) go where the
mode says, and overflow follows IEEE (ties beyond the largest finite value go to inf for rint/round). FP8 targets
use torch's RNE conversion for every mode. The value keeps its shape, valid box and kind; casting to the same
dtype copies. Scalars (Python numbers) support only the default mode, with C conversion semantics: float -> int
truncates (saturating), int -> int wraps to the target width, float targets round to nearest-even.
"""
from __future__ import annotations

import math
import numbers

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import CastMode
from pypto_rt.ops.dtype_rules import int_range, storage_dtype, to_dtype
from pypto_rt.ops.opdef import ANY_DIM, Shape
from pypto_rt.ops.registry import op
from pypto_rt.ops.recording import ScalarFromData
from pypto_rt.ops.value import TensorValue

_F64 = torch.float64
# Float storages the bit-stepping rounder handles: (signed view of the bits, sign bit).
_BITS = {torch.bfloat16: (torch.int16, 1 << 15), torch.float16: (torch.int16, 1 << 15),
         torch.float32: (torch.int32, 1 << 31)}
_MODE_NAMES = ", ".join(f"{m.name} ({m.value})" for m in CastMode)


def _mode(mode) -> CastMode:
    if isinstance(mode, CastMode):
        return mode
    if isinstance(mode, str) and mode.lower() in CastMode.__members__:
        return CastMode[mode.lower()]
    if isinstance(mode, int) and not isinstance(mode, bool) and mode in CastMode._value2member_map_:
        return CastMode(mode)
    raise OpError(f"pl.cast: unknown mode {mode!r}", hint=f"use one of {_MODE_NAMES}")


@op("cast", "tensor.cast", "tile.cast", shape=Shape.SAME, coalesce=ANY_DIM)
def cast(input, target_type, mode="round"):
    dtype = to_dtype(target_type)
    m = _mode(mode)
    if isinstance(input, TensorValue):
        return _cast_value(input, dtype, m)
    if isinstance(input, numbers.Real):
        if m != CastMode.round:
            raise OpError(f"pl.cast: a scalar supports only the default mode, got mode={mode!r}",
                          hint="drop mode=, or round the value in Python first")
        return _cast_scalar(input, dtype)
    raise OpError(f"pl.cast expects a tensor, a tile or a number, got {type(input).__name__}")


@op("const")
def const(value, dtype):
    if not isinstance(value, numbers.Real):
        raise OpError(f"pl.const expects a number, got {type(value).__name__}")
    return _cast_scalar(value, to_dtype(dtype))


# ---------------------------------------------------------------------------------------------- tensors

def _cast_value(x: TensorValue, dtype, mode: CastMode) -> TensorValue:
    target = storage_dtype(dtype)
    if dtype == x.dtype:
        return x.derive(x.data.clone())
    if dtype == D.BOOL:
        out = x.data != 0
    elif dtype.is_float():
        out = _to_float(x.data, x.dtype, target, mode)
    elif x.dtype.is_float():
        out = _float_to_int(x.data, dtype, mode)
    else:
        out = _int_to_int(x.data, x.dtype, dtype, target)
    return x.derive(out, dtype)


def _int_to_int(src: torch.Tensor, src_dtype, dtype, target: torch.dtype) -> torch.Tensor:
    """Saturating integer conversion; one conversion (a copy for the same storage) when every value of the source
    dtype fits the target (storage holds values of its pl dtype's range)."""
    lo, hi = _clipped_range(dtype)
    src_lo, src_hi = (0, 1) if src_dtype == D.BOOL else int_range(src_dtype)
    if lo <= src_lo and src_hi <= hi:
        return src.clone() if src.dtype == target else src.to(target)
    wide = src if src.dtype == torch.int64 else src.to(torch.int64)
    return wide.clamp(lo, hi).to(target)


def _float_to_int(src: torch.Tensor, dtype, mode: CastMode) -> torch.Tensor:
    """Round with `mode`, saturate, NaN -> 0. Rounds and clamps in the source's own format where both ends of the
    target range are exact in it (rounding a float to an integral value is exact in its format), else in float64,
    as `odd` always does (its tie test `x - floor(x)` rounds for negative x in a narrow format); `trunc` needs no
    rounding step: the final conversion truncates toward zero."""
    lo, hi = _clipped_range(dtype)
    in_place = mode != CastMode.odd and _exact_integer(lo, src.dtype) and _exact_integer(hi, src.dtype)
    work = src if in_place else src.to(_F64)
    return _saturate(work if mode == CastMode.trunc else _round_integral(work, mode), dtype)


def _exact_integer(v: int, fmt: torch.dtype) -> bool:
    """Integer `v` is exactly representable in float format `fmt` (float64, FP32, FP16 or BF16)."""
    bits = 53 if fmt == _F64 else _MANTISSA.get(fmt)
    if bits is None:
        return False
    m = abs(v)
    return m == 0 or (m >> ((m & -m).bit_length() - 1)).bit_length() <= bits and m <= torch.finfo(fmt).max


def _to_float(src: torch.Tensor, src_dtype, target: torch.dtype, mode: CastMode) -> torch.Tensor:
    nearest_even = mode in (CastMode.none, CastMode.rint)
    if target not in _BITS or src.dtype == torch.bool:
        return src.to(target)
    if src_dtype.is_float() and (nearest_even or target == torch.float32):
        return src.to(target)  # one RNE rounding (or an exact widening)
    if nearest_even and target == torch.float32 and src.dtype != torch.int64:
        return src.to(target)
    if not src_dtype.is_float():
        lo, hi = int_range(src_dtype)
        if max(-lo, hi) <= 1 << _MANTISSA[target]:   # every value exact in the target: no rounding step
            return src.to(target)
        if _single_rounding(src_dtype, target) and mode in (CastMode.none, CastMode.rint, CastMode.round):
            return _int_to_float(src, target, mode)
    return _round_float(src.to(_F64), target, mode)


_MANTISSA = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}   # significand bits, implicit one included


def _single_rounding(dtype, target: torch.dtype) -> bool:
    """torch converts every value of this integer dtype, held exactly in float64, to `target` with one RNE
    rounding: float64 -> FP32 rounds once; float64 -> FP16/BF16 goes through FP32, which is exact below 2^24
    (FP16 overflows past 65520 anyway; BF16 would round twice above 2^24)."""
    lo, hi = int_range(dtype)
    if target == torch.bfloat16:
        return -(1 << 24) <= lo and hi <= 1 << 24
    return -(1 << 53) <= lo and hi <= 1 << 53


def _int_to_float(src: torch.Tensor, target: torch.dtype, mode: CastMode) -> torch.Tensor:
    """Integers -> `target`, rounded once: torch's RNE conversion (direct from 32-bit or narrower storage, which
    torch converts with one rounding; int64 through float64), then, for `round` (ties away from zero), the exact
    ties RNE sent toward zero moved to the neighbour away from zero. An integer rounds to 0 only from 0, so that
    neighbour is `nextafter(y, 2y)`; past the largest finite value it is inf, as IEEE rounding gives. Same results
    as `_round_float` for these inputs, in under half of the torch calls."""
    x = None if src.dtype in _DIRECT_TO_FLOAT else src.to(_F64)
    y = src.to(target) if x is None else x.to(target)
    if mode != CastMode.round:
        return y
    x = src.to(_F64) if x is None else x
    away = torch.nextafter(y, y * 2)
    toward_zero_tie = (x - y.to(_F64)) == (away.to(_F64) - x)
    return torch.where(toward_zero_tie, away, y)


# Integer storages torch converts to a float target with a single RNE rounding: the value goes through FP32, exact
# below 2^24 (past it FP16 overflows anyway; `_single_rounding` keeps BF16 to sources below 2^24).
_DIRECT_TO_FLOAT = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32})


def _clipped_range(dtype) -> tuple[int, int]:
    lo, hi = int_range(dtype)
    return max(lo, -(1 << 63)), min(hi, (1 << 63) - 1)


def _round_integral(x: torch.Tensor, mode: CastMode) -> torch.Tensor:
    """Round float64 values to integral float64 values with `mode`."""
    if mode in (CastMode.none, CastMode.rint):
        return torch.round(x)  # ties to even
    if mode == CastMode.floor:
        return torch.floor(x)
    if mode == CastMode.ceil:
        return torch.ceil(x)
    if mode == CastMode.trunc:
        return torch.trunc(x)
    t = torch.trunc(x)
    if mode == CastMode.round:  # ties away from zero; x - t is exact in float64
        return t + torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))
    tie = (x - torch.floor(x)) == 0.5  # CastMode.odd
    return torch.where(tie, 2 * torch.floor(x / 2) + 1, torch.round(x))


def _saturate(r: torch.Tensor, dtype) -> torch.Tensor:
    """Integral float64 values -> `dtype`, clamped to its range; NaN -> 0."""
    lo, hi = _clipped_range(dtype)
    if -(1 << 53) <= lo and hi <= 1 << 53:   # both ends exact in float64 (up to 32-bit targets): clamp there
        return torch.nan_to_num(r, nan=0.0).clamp_(lo, hi).to(storage_dtype(dtype))
    big, small, nan = r >= float(hi), r <= float(lo), torch.isnan(r)
    safe = torch.where(big | small | nan, torch.zeros_like(r), r).to(torch.int64)
    out = torch.where(big, torch.full_like(safe, hi), torch.where(small, torch.full_like(safe, lo), safe))
    return out.to(storage_dtype(dtype))


def _step(y: torch.Tensor, up: torch.Tensor, view: torch.dtype, sign_bit: int) -> torch.Tensor:
    """The representable neighbour of `y` toward +inf where `up`, else toward -inf (by bit pattern)."""
    bits = y.view(view).to(torch.int64) & ((sign_bit << 1) - 1)  # unsigned bit pattern
    neg = bits >= sign_bit
    mag = bits & (sign_bit - 1)
    zero = mag == 0
    new_mag = torch.where(zero, torch.ones_like(mag), torch.where(neg != up, mag + 1, mag - 1))
    new_neg = torch.where(zero, ~up, neg)
    out = new_mag + new_neg.to(torch.int64) * sign_bit
    out = torch.where(out >= sign_bit, out - (sign_bit << 1), out)  # back to the signed view's range
    return out.to(view).view(y.dtype)


def _overflow_value(target: torch.dtype) -> float:
    """Where the value after the largest finite one would sit (the distance rule's stand-in for inf)."""
    fi = torch.finfo(target)
    return fi.max + fi.eps * 2.0 ** (math.frexp(fi.max)[1] - 1)


def _as_f64(v: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    d = v.to(_F64)
    big = _overflow_value(target)
    return torch.where(torch.isinf(d), torch.sign(d) * big, d)


def _round_float(x: torch.Tensor, target: torch.dtype, mode: CastMode) -> torch.Tensor:
    """Round float64 values to `target` (BF16/FP16/FP32) exactly once, with `mode`."""
    view, sign_bit = _BITS[target]
    y = x.to(target)  # within one step of x, possibly off by double rounding
    yd = y.to(_F64)
    other = _step(y, x > yd, view, sign_bit)
    lo = torch.where(x > yd, y, other)
    hi = torch.where(x > yd, other, y)
    pick_hi = _pick_hi(x, lo, hi, target, mode, view)
    out = torch.where(pick_hi, hi, lo)
    return torch.where((x == yd) | torch.isnan(x), y, out)


def _pick_hi(x, lo, hi, target, mode: CastMode, view) -> torch.Tensor:
    """Whether `mode` picks the upper neighbour `hi` over `lo` (lo < x < hi)."""
    if mode == CastMode.floor:
        return torch.zeros_like(x, dtype=torch.bool)
    if mode == CastMode.ceil:
        return torch.ones_like(x, dtype=torch.bool)
    if mode == CastMode.trunc:
        return x < 0
    d_lo = x - _as_f64(lo, target)
    d_hi = _as_f64(hi, target) - x
    if mode == CastMode.round:
        tie_hi = x > 0
    else:
        hi_even = (hi.view(view) & 1) == 0
        tie_hi = hi_even if mode in (CastMode.none, CastMode.rint) else ~hi_even
    return (d_hi < d_lo) | ((d_hi == d_lo) & tie_hi)


# ---------------------------------------------------------------------------------------------- scalars

def _cast_scalar(v, dtype):
    """C conversion of a Python number to a scalar of `dtype`."""
    if dtype == D.BOOL:
        return bool(v)
    if dtype.is_float():
        target = storage_dtype(dtype)
        if target not in _BITS:
            return float(torch.tensor(float(v), dtype=_F64).to(target).item())
        return float(_round_float(torch.tensor([float(v)], dtype=_F64), target, CastMode.rint)[0].item())
    if not dtype.is_int():
        raise OpError(f"pl.cast: cannot convert a scalar to {dtype!r}")
    if isinstance(v, ScalarFromData) and isinstance(v, int):   # read from data while recording: the same integer while it fits (guarded)
        lo, hi = int_range(dtype)
        if lo <= v <= hi:
            return v
    if isinstance(v, numbers.Integral):
        bits = dtype.bits
        w = int(v) & ((1 << bits) - 1)
        return w - (1 << bits) if dtype.is_signed_int() and w >= 1 << (bits - 1) else w
    f = float(v)
    if math.isnan(f):
        return 0
    lo, hi = int_range(dtype)
    return lo if f <= lo else hi if f >= hi else math.trunc(f)
