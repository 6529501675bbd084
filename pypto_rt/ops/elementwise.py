"""Elementwise arithmetic (spec §4.3): add/sub/mul/div and their scalar forms, max/min, fmod/rem, the carry forms,
the `part_*` ops over valid boxes, and the scalar `pl.min`/`pl.max`.

The shared machinery (operand checks, promotion, valid boxes) is in elementwise_core.py; unary math, compare/select
and bitwise ops have their own modules. Integer division or remainder by zero gives 0 (undefined on device; the pad
outside a valid box may hold zeros).
"""
from __future__ import annotations

import builtins

import torch

from pypto_rt.errors import OpError
from pypto_rt.ops.dtype_rules import promote
from pypto_rt.ops.elementwise_core import (
    ELEMENTWISE, binary, compute_dtype, describe, is_scalar, names_all, names_tile, need_scalar, need_value, register,
    store, two_operand_impl,
)
from pypto_rt.ops.opdef import NO_DIM, Shape
from pypto_rt.ops.registry import op
from pypto_rt.ops.recording import less
from pypto_rt.ops.value import TensorValue, valid_mask


def _zero_safe(fn):
    """Integer division-like `fn` with divisor 0 giving 0 instead of a torch error."""
    def run(a, b):
        if a.is_floating_point():
            return fn(a, b)
        zero = b == 0
        out = fn(a, torch.where(zero, torch.ones_like(b), b))
        return torch.where(zero, torch.zeros_like(out), out)
    return run


def _tdiv(a, b):
    return a / b if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")


_div = _zero_safe(_tdiv)
_fmod = _zero_safe(torch.fmod)
_rem = _zero_safe(torch.remainder)


# ------------------------------------------------------------------------------------- arithmetic

@op(*names_all("add"), **ELEMENTWISE)
def add(lhs, rhs):
    if is_scalar(lhs) and is_scalar(rhs):
        return lhs + rhs
    return binary("add", lhs, rhs, torch.add)


@op(*names_all("sub"), **ELEMENTWISE)
def sub(lhs, rhs):
    if is_scalar(lhs) and is_scalar(rhs):
        return lhs - rhs
    return binary("sub", lhs, rhs, torch.sub, keep_lhs=is_scalar(rhs))  # subs keeps the lhs dtype


@op(*names_all("mul"), **ELEMENTWISE)
def mul(lhs, rhs):
    if is_scalar(lhs) and is_scalar(rhs):
        return lhs * rhs
    return binary("mul", lhs, rhs, torch.mul)


@op(*names_all("div"), **ELEMENTWISE, non_operands=frozenset({"high_precision"}))
def div(lhs, rhs, high_precision=False):
    # true division for floats, truncating division for integers; `high_precision` is a hint only
    if is_scalar(lhs) and is_scalar(rhs):
        return lhs / rhs
    return binary("div", lhs, rhs, _div)


def _binary_op(name, fn, names=None):
    """A tensor-or-scalar second operand form (`maximum`, `fmod`, ...)."""
    def impl(lhs, rhs):
        return binary(name, lhs, rhs, fn)
    return register(impl, name, names or names_all(name))


def _scalar_op(name, plain, fn, *, keep_lhs=False, names=None, tmp=False, nonzero_fn=None):
    """A scalar-only second operand form (`adds`, `maximums`, ...); tile scratch `tmp` ignored. `nonzero_fn`: the
    form without the divisor-0 guard, taken for a literal nonzero int (a block size: two torch calls fewer)."""
    def run(lhs, rhs):
        need_scalar(name, rhs, plain)
        lean = nonzero_fn is not None and type(rhs) is int and rhs != 0   # (a value read from data is no int)
        return binary(name, lhs, rhs, nonzero_fn if lean else fn, keep_lhs=keep_lhs)
    impl = two_operand_impl(run, tmp)
    return register(impl, name, names or names_all(name))


adds = _scalar_op("adds", "add", torch.add)
subs = _scalar_op("subs", "sub", torch.sub, keep_lhs=True)
muls = _scalar_op("muls", "mul", torch.mul)
divs = _scalar_op("divs", "div", _div, nonzero_fn=_tdiv)
maximum = _binary_op("maximum", torch.maximum)
minimum = _binary_op("minimum", torch.minimum)
maximums = _scalar_op("maximums", "maximum", torch.maximum, names=("maximums", "tile.maximums", "maxs"))
minimums = _scalar_op("minimums", "minimum", torch.minimum, names=("minimums", "tile.minimums", "mins"))
fmod = _binary_op("fmod", _fmod)
fmods = _scalar_op("fmods", "fmod", _fmod, nonzero_fn=torch.fmod)
rems = _scalar_op("rems", "rem", _rem, names=names_tile("rems"), tmp=True, nonzero_fn=torch.remainder)


@op(*names_tile("rem"), **ELEMENTWISE)
def rem(lhs, rhs, tmp=None):
    return binary("rem", lhs, rhs, _rem)


def _carry_op(name, first, scalar=False):
    """`addc`/`subc` (lhs, rhs, carry) and `addsc`/`subsc` (lhs, scalar, carry): two rounded steps on device."""
    def run(lhs, rhs, carry):
        if scalar:
            need_scalar(name, rhs, name[:3] + "c")
        step = binary(name, lhs, rhs, first, keep_lhs=scalar and first is torch.sub)
        return binary(name, step, carry, torch.add)
    if scalar:
        def impl(lhs, scalar, carry):
            return run(lhs, scalar, carry)
    else:
        def impl(lhs, rhs, carry):
            return run(lhs, rhs, carry)
    return register(impl, name, names_tile(name))


addc = _carry_op("addc", torch.add)
subc = _carry_op("subc", torch.sub)
addsc = _carry_op("addsc", torch.add, scalar=True)
subsc = _carry_op("subsc", torch.sub, scalar=True)


def _part(name, lhs, rhs, fn):
    """Op where both operands are valid, the valid one where only one is; result box = union's extent."""
    need_value(name, lhs, "first operand")
    need_value(name, rhs, "second operand")
    if lhs.shape != rhs.shape:
        raise OpError(f"pl.{name}: operand shapes {list(lhs.shape)} and {list(rhs.shape)} differ",
                      hint="part_* ops need equal physical shapes; only the valid boxes may differ")
    dtype = promote(lhs.dtype, rhs.dtype)
    cdt = compute_dtype(dtype)
    a, b = lhs.data.to(cdt), rhs.data.to(cdt)
    both = fn(a, b)
    ma = valid_mask(lhs) if lhs.valid is not None else torch.ones((), dtype=torch.bool)
    mb = valid_mask(rhs) if rhs.valid is not None else torch.ones((), dtype=torch.bool)
    out = torch.where(ma & mb, both, torch.where(ma, a, torch.where(mb, b, both)))
    box = tuple(builtins.max(x, y) for x, y in zip(lhs.valid_shape, rhs.valid_shape))
    return TensorValue(store(out, dtype), dtype, box, lhs.is_tile or rhs.is_tile)


def _part_op(name, fn):
    def impl(lhs, rhs):
        return _part(name, lhs, rhs, fn)
    # the result box is the union of the operands' boxes: the compiler treats these as opaque
    return register(impl, name, names_all(name), shape=Shape.OTHER, coalesce=NO_DIM, broadcasts=False)


part_add = _part_op("part_add", torch.add)
part_mul = _part_op("part_mul", torch.mul)
part_max = _part_op("part_max", torch.maximum)
part_min = _part_op("part_min", torch.minimum)


# ------------------------------------------------------------------------------ scalar min / max

def _scalar_pair(name: str, a, b) -> None:
    for x in (a, b):
        if not is_scalar(x):
            what = "row_min / pl.minimum" if name == "min" else "row_max / pl.maximum"
            raise OpError(f"pl.{name} is the scalar {name}imum of two numbers, got {describe(x)}",
                          hint=f"for tensors use pl.{what}")


@op("min", **ELEMENTWISE)
def scalar_min(a, b):
    _scalar_pair("min", a, b)
    return b if less(b, a) else a   # as builtins.min (the first of equal ones), also for numbers read from data


@op("max", **ELEMENTWISE)
def scalar_max(a, b):
    _scalar_pair("max", a, b)
    return b if less(a, b) else a
