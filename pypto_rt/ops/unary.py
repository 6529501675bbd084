"""Unary elementwise math (spec §4.3): neg, abs, exp, log, sqrt, rsqrt, recip, relu, sin, cos, and the leaky
relus (a scalar or tensor slope). Each keeps its input's shape, dtype and valid box; float-only ops say so."""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.ops.elementwise_core import (
    ELEMENTWISE, binary, names_all, names_tile, need_scalar, register, unary,
)
from pypto_rt.ops.flush import exp_ftz
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue

_HIGH_PRECISION = frozenset({"high_precision"})


def _unary_op(name, fn, *, hp=False, names=None, **checks):
    """A one-input op; `hp` adds the `high_precision=False` hint (ignored: torch is already precise)."""
    if hp:
        def impl(input, high_precision=False):
            return unary(name, input, fn, **checks)
    else:
        def impl(input):
            return unary(name, input, fn, **checks)
    return register(impl, name, names or names_all(name), **({"non_operands": _HIGH_PRECISION} if hp else {}))


neg = _unary_op("neg", torch.neg)
abs = _unary_op("abs", torch.abs)  # noqa: A001  (pl.abs)
exp = _unary_op("exp", exp_ftz, float_only=True)   # subnormal results flush to 0 (ops/flush.py)
log = _unary_op("log", torch.log, float_only=True, hp=True)
sqrt = _unary_op("sqrt", torch.sqrt, float_only=True)
recip = _unary_op("recip", torch.reciprocal, float_only=True, hp=True)
relu = _unary_op("relu", torch.relu, names=names_tile("relu"))
sin = _unary_op("sin", torch.sin, fp32_only=True)
cos = _unary_op("cos", torch.cos, fp32_only=True)


@op(*names_all("rsqrt"), **ELEMENTWISE, non_operands=_HIGH_PRECISION)
def rsqrt(input, high_precision=False):
    # `pl.tile.rsqrt(tile, tmp)` passes a scratch tile positionally; `high_precision=True` is tensor-only
    if isinstance(input, TensorValue) and input.is_tile and high_precision is True:
        raise OpError("pl.rsqrt: high_precision is not supported for Tile operands",
                      hint="the tile form selects precision by taking a scratch tile: pl.tile.rsqrt(tile, tmp)")
    return unary("rsqrt", input, torch.rsqrt, float_only=True)


@op(*names_tile("lrelu"), **ELEMENTWISE)
def lrelu(input, slope):
    need_scalar("lrelu", slope, "prelu")
    return binary("lrelu", input, slope, lambda x, s: torch.where(x > 0, x, x * s), keep_lhs=True)


@op(*names_tile("prelu"), **ELEMENTWISE)
def prelu(input, slope, tmp=None):
    return binary("prelu", input, slope, lambda x, s: torch.where(x > 0, x, x * s), keep_lhs=True,
                  valid=input.valid if isinstance(input, TensorValue) else None)
