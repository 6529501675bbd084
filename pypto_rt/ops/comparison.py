"""Compare and select (spec §4.3): `cmp`/`cmps` (codes 0..5 = eq, ne, lt, le, gt, ge) and `sel`/`sels`.

The tensor `cmp` returns numeric 0/1 in the promoted operand dtype; the tile forms return a BOOL mask, which only
`sel`/`sels` consume. `cmp` never propagates a valid box; `sel`/`sels` keep their first value operand's box.
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops import recording
from pypto_rt.ops.dtype_rules import promote
from pypto_rt.ops.elementwise_core import (
    ELEMENTWISE, binary, check_broadcast, dtype_of, names_all, names_tile, need_scalar, need_value,
)
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue, broadcast_shape

_CMP_TYPE = frozenset({"cmp_type"})
_CMP = (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge)
_CMP_NAMES = {"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5}


def _cmp_fn(name: str, cmp_type):
    code = _CMP_NAMES.get(cmp_type.lower(), -1) if isinstance(cmp_type, str) else cmp_type
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 5:
        raise OpError(f"pl.{name}: cmp_type must be 0..5 (eq, ne, lt, le, gt, ge), got {cmp_type!r}")
    return _CMP[code]


def _compare(name, lhs, rhs, cmp_type):
    """Tensor form: numeric 0/1 in the promoted operand dtype; the comparison's bool result is noted for a `sel`
    over it in the same run (`_mask`: no `!= 0` pass). Tile form: a BOOL mask for pl.sel."""
    fn = _cmp_fn(name, cmp_type)
    need_value(name, lhs, "first operand")
    out_dtype = D.BOOL if lhs.is_tile else promote(lhs.dtype, dtype_of(rhs))
    made = []

    def compare(a, b):
        made.append(fn(a, b))
        return made[0]
    out = binary(name, lhs, rhs, compare, out_dtype=out_dtype, valid=None)
    if out.data is not made[0]:
        recording.notes().note(out.data, _COMPARE_MASK, made[0])
    return out


_COMPARE_MASK = "compare mask"   # the kind of note a numeric cmp result carries: its bool result (recording.notes)


@op(*names_all("cmp"), **ELEMENTWISE, non_operands=_CMP_TYPE)
def cmp(lhs, rhs, cmp_type=0):
    return _compare("cmp", lhs, rhs, cmp_type)


@op(*names_tile("cmps"), **ELEMENTWISE, non_operands=_CMP_TYPE)
def cmps(lhs, rhs, cmp_type=0):
    need_scalar("cmps", rhs, "cmp")
    return _compare("cmps", lhs, rhs, cmp_type)


def _mask(name: str, mask, shape) -> torch.Tensor:
    need_value(name, mask, "mask")
    try:
        broadcast_shape(mask.shape, shape)
    except ValueError:
        raise OpError(f"pl.{name}: mask shape {list(mask.shape)} does not match operand shape {list(shape)}") \
            from None
    data = mask.data
    if data.dtype is torch.bool:
        return data
    kept = recording.notes().fact(data, _COMPARE_MASK)   # a cmp result of this run not written since: no `!= 0`
    return kept if kept is not None else data != 0


def _stored_alike(lhs, rhs) -> bool:
    """Whether `rhs` is a value of `lhs`'s dtype, stored alike (then a select needs no compute dtype)."""
    return isinstance(rhs, TensorValue) and rhs.dtype == lhs.dtype and rhs.data.dtype is lhs.data.dtype


def _select_in_storage(m: torch.Tensor, lhs: TensorValue, rhs: TensorValue) -> TensorValue:
    """Select between two values stored alike, in their storage (a select is exact in any dtype: no round trip
    through the compute dtype)."""
    out = torch.where(m, lhs.data, rhs.data)
    box = lhs.valid if tuple(out.shape) == lhs.shape else None   # lhs broadcast: its box no longer applies
    return TensorValue(out, lhs.dtype, box, lhs.is_tile or rhs.is_tile)


@op(*names_tile("sel"), **ELEMENTWISE)
def sel(mask, lhs, rhs, tmp=None):
    need_value("sel", lhs, "lhs")
    m = _mask("sel", mask, lhs.shape)
    if _stored_alike(lhs, rhs):
        check_broadcast("sel", lhs, rhs)
        return _select_in_storage(m, lhs, rhs)
    return binary("sel", lhs, rhs, lambda a, b: torch.where(m, a, b), valid=lhs.valid)


@op(*names_tile("sels"), **ELEMENTWISE)
def sels(mask, src, tmp=None, scalar=None):
    need_value("sels", src, "src")
    need_scalar("sels", scalar, "sel")
    m = _mask("sels", mask, src.shape)
    fast = _sels_half(m, src, scalar)
    if fast is not None:
        return fast
    return binary("sels", src, scalar, lambda a, b: torch.where(m, a, b), keep_lhs=True)


_HALVES = (torch.bfloat16, torch.float16)


def _sels_half(m: torch.Tensor, src: TensorValue, scalar) -> TensorValue | None:
    """`sels` of a 2-byte float value with a Python number, in its storage: the same result as the compute-dtype
    path (a select computes nothing; the number rounds to FP32, then to the value's dtype, as a store does)
    without its two casts; on 4-byte words (two elements each) where the mask is one per row (torch selects
    2-byte elements ~2x slower). None where it does not apply."""
    data = src.data
    if data.dtype not in _HALVES or type(scalar) not in (float, int) or tuple(m.shape) == () \
            or broadcast_shape(m.shape, data.shape) != tuple(data.shape):
        return None
    fill = torch.tensor(scalar, dtype=torch.float32).to(data.dtype)
    if m.shape[-1] == 1 and data.shape[-1] % 2 == 0 and data.is_contiguous() and data.storage_offset() % 2 == 0:
        word = fill.view(torch.int16).to(torch.int32) & 0xFFFF
        out = torch.where(m, data.view(torch.int32), word | (word << 16)).view(data.dtype)
    else:
        out = torch.where(m, data, fill)
    return TensorValue(out, src.dtype, src.valid, src.is_tile)
