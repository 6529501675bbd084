"""Bitwise and shift ops (spec §4.3): `and_`/`or_`/`xor`/`shl`/`shr` (tensor or integer rhs), their scalar-only
`*s` forms and `not_`. Integers only, no broadcasting between tensors, and the result keeps the lhs dtype."""
from __future__ import annotations

import numbers

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops.elementwise_core import ELEMENTWISE, binary, names_all, need_value, register, two_operand_impl, unary
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue

def _int_value(name: str, x) -> None:
    if not (x.dtype.is_int() or x.dtype == D.BOOL):
        raise OpError(f"pl.{name} needs an integer tensor, got {x.dtype!r}", hint="pl.cast it to pl.INT32 first")


def _bitwise(name, lhs, rhs, fn, shift=False):
    """Integer-only, no broadcasting, same dtypes; the result keeps the lhs dtype."""
    need_value(name, lhs, "first operand")
    _int_value(name, lhs)
    if isinstance(rhs, TensorValue):
        _int_value(name, rhs)
        if rhs.shape != lhs.shape or rhs.dtype != lhs.dtype:
            raise OpError(f"pl.{name}: operands must have the same shape and dtype, got "
                          f"{list(lhs.shape)} {lhs.dtype!r} and {list(rhs.shape)} {rhs.dtype!r}",
                          hint="bitwise/shift ops do not broadcast; reshape or cast explicitly first")
    elif not isinstance(rhs, numbers.Integral):
        raise OpError(f"pl.{name}: the scalar operand must be an integer, got {rhs!r}")
    elif shift and not 0 <= rhs < lhs.dtype.bits:
        raise OpError(f"pl.{name}: shift count must be in [0, {lhs.dtype.bits - 1}], got {rhs}")
    if shift:
        base = fn
        fn = lambda a, b: base(a, b.clamp(0, 63))  # noqa: E731  (counts outside a valid box may be garbage)
    return binary(name, lhs, rhs, fn, keep_lhs=True)


def _bitwise_op(name, fn, *, shift=False, scalar=False, tmp=False):
    """`and_`/`or_`/`xor`/`shl`/`shr` (tensor or integer rhs) and their scalar-only `*s` forms."""
    def run(lhs, rhs):
        if scalar and isinstance(rhs, TensorValue):
            raise OpError(f"pl.{name} takes an integer scalar second operand, got {rhs!r}",
                          hint=f"use pl.{name[:-1]}{'_' if name in ('ands', 'ors') else ''} for two tensors")
        return _bitwise(name, lhs, rhs, fn, shift)
    impl = two_operand_impl(run, tmp)
    return register(impl, name, names_all(name))


and_ = _bitwise_op("and_", torch.bitwise_and)
or_ = _bitwise_op("or_", torch.bitwise_or)
xor = _bitwise_op("xor", torch.bitwise_xor, tmp=True)
shl = _bitwise_op("shl", torch.bitwise_left_shift, shift=True)
shr = _bitwise_op("shr", torch.bitwise_right_shift, shift=True)
ands = _bitwise_op("ands", torch.bitwise_and, scalar=True)
ors = _bitwise_op("ors", torch.bitwise_or, scalar=True)
xors = _bitwise_op("xors", torch.bitwise_xor, scalar=True, tmp=True)
shls = _bitwise_op("shls", torch.bitwise_left_shift, shift=True, scalar=True)
shrs = _bitwise_op("shrs", torch.bitwise_right_shift, shift=True, scalar=True)


@op(*names_all("not_"), **ELEMENTWISE)
def not_(input):
    # INT16/UINT16 only (the hardware instruction's types)
    need_value("not_", input, "input")
    if input.dtype not in (D.INT16, D.UINT16):
        raise OpError(f"pl.not_ supports INT16 and UINT16 only, got {input.dtype!r}",
                      hint="pl.xors(x, -1) inverts other integer types")
    return unary("not_", input, torch.bitwise_not)
