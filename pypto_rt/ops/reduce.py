"""Row/column reductions and row/column broadcasts (spec §4.5).

`row_*` reduce the last axis and `col_*` axis -2, over the VALID extent of that axis only: cells outside the valid
box are masked with the reduction's identity, so garbage there never leaks in. The reduced axis becomes a fully
valid unit axis (keepdim); other axes keep their valid extent. Value reductions return the input dtype (16-bit
floats accumulate in FP32 and round to nearest-even once; integers accumulate in int64); `*_argmax/argmin`
return INT32 indices of the first extremum. Tile forms take a scratch `tmp_tile`, accepted and ignored.
`row_expand_<op>(x[..., M, N], v[..., M, 1])` and `col_expand_<op>(x[..., M, N], v[..., 1, N])` broadcast v over
x (promoted dtype, x's valid box); `row_expand(target, v)` / `col_expand(target, v)` broadcast v to target's
shape (target values ignored).
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops.dtype_rules import highest, lowest, promote, storage_dtype
from pypto_rt.ops.flush import exp_ftz
from pypto_rt.ops.opdef import ANY_DIM, COLS, NO_DIM, ROWS, Shape
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue, broadcast_shape

_INT64_MAX = (1 << 63) - 1


def _all(name: str) -> tuple[str, str, str]:
    return name, f"tensor.{name}", f"tile.{name}"


def _need_value(name: str, x, what: str) -> None:
    if not isinstance(x, TensorValue):
        raise OpError(f"pl.{name}: the {what} must be a tensor or tile, got {type(x).__name__}")


def _compute(name: str, x: TensorValue) -> torch.Tensor:
    if not (x.dtype.is_float() or x.dtype.is_int()):
        raise OpError(f"pl.{name}: cannot reduce values of dtype {x.dtype!r}", hint="pl.cast to a numeric dtype first")
    return _as(x.data, torch.float32 if x.dtype.is_float() else torch.int64)


def _as(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`data.to(dtype)` without the call when it is already that dtype (the common FP32 case)."""
    return data if data.dtype is dtype else data.to(dtype)


def _store(data: torch.Tensor, dtype) -> torch.Tensor:
    if dtype in (D.UINT16, D.UINT32):
        data = data.to(torch.int64) & ((1 << dtype.bits) - 1)
    return _as(data, storage_dtype(dtype))


def _fill(kind: str, x: TensorValue, data: torch.Tensor):
    """The identity of reduction `kind` (what masked cells become)."""
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    want_max = kind in ("max", "argmax")
    if data.is_floating_point():
        return -float("inf") if want_max else float("inf")
    return lowest(x.dtype) if want_max else min(highest(x.dtype), _INT64_MAX)


_REDUCE = {
    "sum": lambda d, a: d.sum(dim=a, keepdim=True),
    "prod": lambda d, a: d.prod(dim=a, keepdim=True),
    "max": lambda d, a: d.amax(dim=a, keepdim=True),
    "min": lambda d, a: d.amin(dim=a, keepdim=True),
    "argmax": lambda d, a: d.argmax(dim=a, keepdim=True),
    "argmin": lambda d, a: d.argmin(dim=a, keepdim=True),
}


def _reduce(name: str, x, axis: int, kind: str) -> TensorValue:
    _need_value(name, x, "input")
    if x.ndim < (2 if axis == -2 else 1):
        raise OpError(f"pl.{name} needs a tensor of rank >= {-axis}, got shape {list(x.shape)}")
    data = _compute(name, x)
    extent = x.valid_shape[axis]
    if extent < x.shape[axis]:
        keep = (torch.arange(x.shape[axis]) < extent).reshape([-1] + [1] * (-axis - 1))
        data = torch.where(keep, data, torch.full((), _fill(kind, x, data), dtype=data.dtype))
    out = _REDUCE[kind](data, axis)
    dtype = D.INT32 if kind.startswith("arg") else x.dtype
    valid = None   # a fully valid input reduces to a fully valid [..., 1] result
    if x.valid is not None:
        valid = list(x.valid)
        valid[axis] = 1
    return TensorValue(_store(out, dtype), dtype, valid, x.is_tile)


def _reduction(name: str, axis: int, kind: str):
    def impl(input, tmp_tile=None):
        return _reduce(name, input, axis, kind)
    impl.__name__ = impl.__qualname__ = name
    shape = Shape.ROW_REDUCE if axis == -1 else Shape.COL_REDUCE
    # a value reduction keeps the other axis independent (coalescing); arg reductions are left alone
    dims = NO_DIM if kind.startswith("arg") else ROWS if axis == -1 else COLS
    return op(*_all(name), shape=shape, coalesce=dims)(impl)


row_sum = _reduction("row_sum", -1, "sum")
row_max = _reduction("row_max", -1, "max")
row_min = _reduction("row_min", -1, "min")
row_prod = _reduction("row_prod", -1, "prod")
row_argmax = _reduction("row_argmax", -1, "argmax")
row_argmin = _reduction("row_argmin", -1, "argmin")
col_sum = _reduction("col_sum", -2, "sum")
col_max = _reduction("col_max", -2, "max")
col_min = _reduction("col_min", -2, "min")
col_prod = _reduction("col_prod", -2, "prod")
col_argmax = _reduction("col_argmax", -2, "argmax")
col_argmin = _reduction("col_argmin", -2, "argmin")


# ------------------------------------------------------------------------------------------ broadcasts

def _check_vector(name: str, x, v, axis: int) -> None:
    """v must be x's shape with a 1 on `axis` (-1: a per-row [M, 1] vector; -2: a per-column [1, N] one)."""
    _need_value(name, x, "first operand")
    _need_value(name, v, "second operand")
    xs, vs = x.shape, v.shape
    if len(xs) == 2 and len(vs) == 2 and vs[axis] == 1 and vs[axis + 1] == xs[axis + 1]:
        return  # the common 2-D case, decided without broadcasting
    want = list(x.shape)
    if x.ndim >= 2:
        want[axis] = 1
    ok = x.ndim >= 2 and v.ndim >= 2 and v.shape[axis] == 1
    try:
        ok = ok and broadcast_shape(x.shape, v.shape) == tuple(x.shape)
    except ValueError:
        ok = False
    if not ok:
        kind = "[M, 1] per-row" if axis == -1 else "[1, N] per-column"
        raise OpError(f"pl.{name}: expected a {kind} vector of shape {want} for x of shape {list(x.shape)}, "
                      f"got {list(v.shape)}", hint="pl.reshape the vector (e.g. [1, M] -> [M, 1])")


def _expand(name: str, x, v, axis: int, fn) -> TensorValue:
    _check_vector(name, x, v, axis)
    dtype = promote(x.dtype, v.dtype)
    cdt = torch.float32 if dtype.is_float() else torch.int64
    out = fn(_as(x.data, cdt), _as(v.data, cdt))
    return TensorValue(_store(out, dtype), dtype, x.valid, x.is_tile or v.is_tile)


def _tdiv(a, b):
    if a.is_floating_point():
        return a / b
    zero = b == 0
    q = torch.div(a, torch.where(zero, torch.ones_like(b), b), rounding_mode="trunc")
    return torch.where(zero, torch.zeros_like(q), q)  # integer x/0 is undefined on device


_OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _tdiv, "max": torch.maximum,
        "min": torch.minimum, "expdif": lambda a, b: exp_ftz(a - b)}


def _expand_op(side: str, what: str):
    name, axis, fn = f"{side}_expand_{what}", -1 if side == "row" else -2, _OPS[what]
    if side == "row" and what == "add":
        def impl(lhs, rhs, tmp=None):
            return _expand(name, lhs, rhs, axis, fn)
    else:
        def impl(lhs, rhs):
            return _expand(name, lhs, rhs, axis, fn)
    impl.__name__ = impl.__qualname__ = name
    return op(*_all(name), shape=Shape.SAME, coalesce=ANY_DIM, broadcasts=True)(impl)


row_expand_add = _expand_op("row", "add")
row_expand_sub = _expand_op("row", "sub")
row_expand_mul = _expand_op("row", "mul")
row_expand_div = _expand_op("row", "div")
row_expand_max = _expand_op("row", "max")
row_expand_min = _expand_op("row", "min")
row_expand_expdif = _expand_op("row", "expdif")
col_expand_add = _expand_op("col", "add")
col_expand_sub = _expand_op("col", "sub")
col_expand_mul = _expand_op("col", "mul")
col_expand_div = _expand_op("col", "div")
col_expand_max = _expand_op("col", "max")
col_expand_min = _expand_op("col", "min")
col_expand_expdif = _expand_op("col", "expdif")


@op(*_all("row_expand"), shape=Shape.SAME, coalesce=ROWS, broadcasts=True)
def row_expand(target, row_vec):
    return _expand("row_expand", target, row_vec, -1, lambda a, b: b.expand(a.shape).clone())


@op(*_all("col_expand"), shape=Shape.SAME, coalesce=COLS, broadcasts=True)
def col_expand(target, col_vec):
    return _expand("col_expand", target, col_vec, -2, lambda a, b: b.expand(a.shape).clone())
