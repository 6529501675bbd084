"""The machinery every elementwise op shares (spec §4.3): operand checks, dtype promotion, the compute dtype, valid
boxes, and the registration helper of op families.

Binary ops take a tensor/tile first and a tensor/tile or Python number second; tensor operands broadcast
numpy-style. The result dtype follows `promote` (§3.4) except where the spec pins the lhs dtype (`subs`,
bitwise and shift forms); math runs in FP32 for every float dtype and in int64 for every integer dtype, then
the result is stored in `storage_dtype(result)` (unsigned types wrap to their width). Valid boxes follow §3.3:
unary ops and tensor-scalar ops keep the (lhs) box; tensor-tensor ops keep it only when both operands have the
same shape and box, else the result is fully valid; `cmp` never propagates one. Tile scratch arguments
(`tmp`) are accepted and ignored. Mixing a Tensor with a Tile is not rejected here (the CPU result is the same).
"""
from __future__ import annotations

import numbers

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops.dtype_rules import promote, scalar_dtype, storage_dtype
from pypto_rt.ops.opdef import ANY_DIM, Shape
from pypto_rt.ops.registry import op
from pypto_rt.ops.recording import ScalarFromData
from pypto_rt.ops.value import TensorValue, broadcast_shape

# what the compiler knows about an elementwise op: the result has its operands' shape, every dim stays
# independent, tensor operands broadcast against each other
ELEMENTWISE = dict(shape=Shape.SAME, coalesce=ANY_DIM, broadcasts=True)


def names_all(name: str) -> tuple[str, str, str]:
    return name, f"tensor.{name}", f"tile.{name}"


def names_tile(name: str) -> tuple[str, str]:
    return name, f"tile.{name}"


# ----------------------------------------------------------------------------------------------- helpers

def is_scalar(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, TensorValue)


def describe(x) -> str:
    return repr(x) if isinstance(x, TensorValue) else type(x).__name__


def need_value(name: str, x, what: str = "operand") -> None:
    if not isinstance(x, TensorValue):
        hint = "put the tensor first" if is_scalar(x) else None
        raise OpError(f"pl.{name}: the {what} must be a tensor or tile, got {describe(x)}", hint=hint)


def _need_operand(name: str, x) -> None:
    if not (isinstance(x, TensorValue) or is_scalar(x)):
        raise OpError(f"pl.{name}: the second operand must be a tensor, a tile or a number, got {describe(x)}")


def need_scalar(name: str, x, plain: str) -> None:
    if not is_scalar(x):
        raise OpError(f"pl.{name} takes a scalar second operand, got {describe(x)}",
                      hint=f"use pl.{plain} for two tensors")


def dtype_of(x):
    return x.dtype if isinstance(x, TensorValue) else scalar_dtype(x)


def compute_dtype(dtype) -> torch.dtype:
    """Where the math happens: FP32 for every float type, int64 for every integer type."""
    if dtype.is_float():
        return torch.float32
    return torch.bool if dtype == D.BOOL else torch.int64


def _arg(name: str, x, cdt: torch.dtype) -> torch.Tensor:
    if isinstance(x, TensorValue):
        data = x.data
        return data if data.dtype is cdt else data.to(cdt)
    try:
        return torch.tensor(x, dtype=cdt)
    except (OverflowError, RuntimeError, TypeError) as exc:
        raise OpError(f"pl.{name}: scalar {x!r} does not fit the operand type ({exc})") from None


def store(data: torch.Tensor, dtype) -> torch.Tensor:
    """Convert computed values to the storage of `dtype`; UINT16/UINT32 (stored wider) wrap to their width."""
    if dtype in (D.UINT16, D.UINT32):
        data = data.to(torch.int64) & ((1 << dtype.bits) - 1)
    storage = storage_dtype(dtype)
    return data if data.dtype is storage else data.to(storage)


_TAKES_PY_SCALAR = (torch.add, torch.sub, torch.mul)


def check_broadcast(name: str, a: TensorValue, b) -> None:
    if isinstance(b, TensorValue):
        try:
            broadcast_shape(a.shape, b.shape)
        except ValueError:
            raise OpError(f"pl.{name}: operand shapes {list(a.shape)} and {list(b.shape)} do not broadcast",
                          hint="make the shapes equal or 1 on each axis (pl.reshape / pl.slice)") from None


def _binary_valid(a: TensorValue, b):
    if not isinstance(b, TensorValue):
        return a.valid
    return a.valid if a.shape == b.shape and a.valid == b.valid else None


def binary(name, a, b, fn, *, keep_lhs=False, out_dtype=None, valid="auto"):
    """Apply `fn` to (a, b) in the compute dtype of their promoted (or lhs) dtype."""
    if type(a) is TensorValue and a.dtype is D.FP32 and out_dtype is None and valid == "auto":
        fast = _binary_fp32(a, b, fn)   # the common case, with the same result as the general path below
        if fast is not None:
            return fast
    need_value(name, a, "first operand")
    _need_operand(name, b)
    check_broadcast(name, a, b)
    dtype = a.dtype if keep_lhs else promote(a.dtype, dtype_of(b))
    cdt = compute_dtype(dtype)
    if fn in _TAKES_PY_SCALAR and cdt.is_floating_point and _py_scalar(type(b)):
        rhs = b   # torch rounds a Python number to the float compute dtype exactly as torch.tensor(b, cdt) does
    else:
        rhs = _arg(name, b, cdt)
    out = fn(_arg(name, a, cdt), rhs)
    result = dtype if out_dtype is None else out_dtype
    is_tile = a.is_tile or (isinstance(b, TensorValue) and b.is_tile)
    box = _binary_valid(a, b) if valid == "auto" else valid
    if tuple(out.shape) != a.shape:
        box = None  # lhs was broadcast: its box no longer describes the result
    return TensorValue(store(out, result), result, box, is_tile)


def _py_scalar(kind: type) -> bool:
    """Numbers torch takes as they are (plain floats and ints; read from data while recording: as code)."""
    return kind is float or kind is int or issubclass(kind, ScalarFromData)


def _binary_fp32(a: TensorValue, b, fn):
    """FP32 lhs with a same-shape FP32 tensor or a Python number (for add/sub/mul): no promotion, no conversion,
    no broadcasting; None for anything else."""
    tb = type(b)
    if tb is TensorValue:
        if b.dtype is not D.FP32 or b.data.shape != a.data.shape:
            return None
        return TensorValue(fn(a.data, b.data), D.FP32, a.valid if a.valid == b.valid else None,
                           a.is_tile or b.is_tile)
    if fn in _TAKES_PY_SCALAR and _py_scalar(tb):
        return TensorValue(fn(a.data, b), D.FP32, a.valid, a.is_tile)
    return None


def unary(name, x, fn, *, float_only=False, fp32_only=False):
    need_value(name, x, "input")
    if (float_only and not x.dtype.is_float()) or (fp32_only and x.dtype != D.FP32):
        kind = "an FP32" if fp32_only else "a float"
        raise OpError(f"pl.{name} needs {kind} input, got {x.dtype!r}", hint="pl.cast it to pl.FP32 first")
    data = x.data
    cdt = compute_dtype(x.dtype)
    return x.derive(store(fn(data if data.dtype is cdt else data.to(cdt)), x.dtype))


def register(fn, name, names, **facts):
    """Name the generated implementation `fn` and register it under `names` as an elementwise op."""
    fn.__name__ = fn.__qualname__ = name
    return op(*names, **{**ELEMENTWISE, **facts})(fn)


def two_operand_impl(run, tmp: bool):
    """`impl(lhs, rhs)` calling `run`, with an ignored tile scratch `tmp=None` parameter when `tmp`."""
    if tmp:
        def impl(lhs, rhs, tmp=None):
            return run(lhs, rhs)
    else:
        def impl(lhs, rhs):
            return run(lhs, rhs)
    return impl
