"""The matmul family: `pl.matmul` / `pl.matmul_acc` (tensor forms with a_trans/b_trans/out_dtype, 1-D and
batched operands with numpy broadcasting of batch dims), the tile forms (`pl.tile.matmul`, `matmul_acc`,
`matmul_bias`, `batch_matmul`, `batch_matmul_acc`) and `pl.gemv` / `gemv_acc` / `gemv_bias`. Operands are
zero-padded outside their valid boxes (the hardware loads only the valid part into a zeroed tile), so
garbage or NaN there never reaches the result. Float operands are multiplied in FP32 (`x.float() @
w.float()`, what the goldens do); integer operands exactly: 8-bit ones in float64 through BLAS (every sum of
int8 products below 2^53 is exact there: K up to 5e11), wider ones in int64 (torch's int8 matmul would wrap).
Without `out_dtype` the result is FP32 for float operands and INT32 for integer ones (DESIGN.md decision:
the accumulator dtype), otherwise it is cast to `out_dtype`. Accumulating forms require an FP32 (float
operands) or INT32 (int operands) accumulator, return a new value in its dtype and keep its valid box;
every other result is fully valid. `init_cond` truthy overwrites instead of accumulating. The A5 MX
block-scale forms are registered as not supported.
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops.dtype_rules import storage_dtype, to_dtype
from pypto_rt.ops.opdef import ANY_DIM, Shape
from pypto_rt.ops.registry import not_supported, op
from pypto_rt.ops.value import TensorValue, broadcast_shape, valid_mask

_GEMV_DTYPES = (D.INT8, D.FP16, D.BF16, D.FP32)
_ACC_PHASES = (None, "unspecified", "partial", "final")


def _shape(v) -> list[int]:
    return list(v.shape)


def _check_operands(name: str, **values) -> None:
    for arg, v in values.items():
        if not isinstance(v, TensorValue):
            raise OpError(f"pl.{name}: `{arg}` must be a tensor or tile, got {type(v).__name__}")
        if v.dtype == D.BOOL or not (v.dtype.is_float() or v.dtype.is_int()):
            raise OpError(f"pl.{name}: `{arg}` has dtype {v.dtype!r} {_shape(v)}; matmul takes float or integer data")


def _is_float(*values: TensorValue) -> bool:
    return any(v.dtype.is_float() for v in values)


def _compute_dtype(lhs: TensorValue, rhs: TensorValue) -> torch.dtype:
    """FP32 for float operands; float64 for two 8-bit integer ones (exact, and ~30x faster than int64, which
    has no BLAS); int64 for wider integers."""
    if _is_float(lhs, rhs):
        return torch.float32
    return torch.float64 if lhs.dtype.get_byte() == rhs.dtype.get_byte() == 1 else torch.int64


def _acc_dtype(*values: TensorValue):
    """The hardware accumulator dtype: FP32 when any operand is float, INT32 for integer operands."""
    return D.FP32 if _is_float(*values) else D.INT32


def _as(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`data.to(dtype)` without the call when it already is (no-op conversions cost ~1 µs each)."""
    return data if data.dtype is dtype else data.to(dtype)


def _padded(v: TensorValue, compute: torch.dtype) -> torch.Tensor:
    """Operand data in the compute dtype, zero outside its valid box."""
    data = _as(v.data, compute)
    mask = valid_mask(v)
    return data if mask is None else torch.where(mask, data, torch.zeros((), dtype=compute))


def _oriented(name: str, lhs: TensorValue, rhs: TensorValue, a_trans: bool, b_trans: bool):
    """Zero-padded compute tensors with the transposes applied, after the shape checks."""
    if lhs.ndim == 0 or rhs.ndim == 0:
        raise OpError(f"pl.{name}: operands need at least one axis, got lhs {_shape(lhs)}, rhs {_shape(rhs)}")
    for flag, v, side in ((a_trans, lhs, "a_trans/lhs"), (b_trans, rhs, "b_trans/rhs")):
        if flag and v.ndim < 2:
            raise OpError(f"pl.{name}: {side} is 1-D {_shape(v)}; a vector has no axes to transpose, drop the flag")
    if (lhs.ndim > 2 or rhs.ndim > 2) and min(lhs.ndim, rhs.ndim) < 2:
        raise OpError(f"pl.{name}: batched matmul needs both operands at least 2-D, got lhs {_shape(lhs)}, "
                      f"rhs {_shape(rhs)}")
    compute = _compute_dtype(lhs, rhs)
    a, b = _padded(lhs, compute), _padded(rhs, compute)
    a = a.transpose(-1, -2) if a_trans else a
    b = b.transpose(-1, -2) if b_trans else b
    k_lhs, k_rhs = a.shape[-1], b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k_lhs != k_rhs:
        raise OpError(f"pl.{name}: inner dimensions differ: lhs {_shape(lhs)} (a_trans={bool(a_trans)}) has K={k_lhs}, "
                      f"rhs {_shape(rhs)} (b_trans={bool(b_trans)}) has K={k_rhs}")
    if a.dim() > 2 or b.dim() > 2:
        try:
            broadcast_shape(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise OpError(f"pl.{name}: batch dimensions of lhs {_shape(lhs)} and rhs {_shape(rhs)} do not "
                          "broadcast") from None
    return a, b


def _product(name: str, lhs, rhs, a_trans=False, b_trans=False) -> torch.Tensor:
    """lhs @ rhs in FP32 (float operands) or int64 (integer operands, computed exactly: see _compute_dtype)."""
    if lhs.valid is None and rhs.valid is None and lhs.data.dim() == 2 and rhs.data.dim() == 2:
        # the common case: two fully valid 2-D operands, nothing to pad or broadcast
        compute = _compute_dtype(lhs, rhs)
        a, b = _as(lhs.data, compute), _as(rhs.data, compute)
        a, b = (a.t() if a_trans else a), (b.t() if b_trans else b)
        if a.shape[1] == b.shape[0]:
            return _exact_int(torch.mm(a, b))
    a, b = _oriented(name, lhs, rhs, a_trans, b_trans)   # checks shapes and says what is wrong
    return _exact_int(torch.matmul(a, b))


def _exact_int(product: torch.Tensor) -> torch.Tensor:
    """An integer product computed in float64 (exact integers) back as int64."""
    return product.to(torch.int64) if product.dtype == torch.float64 else product


def _result(data: torch.Tensor, dtype, like: TensorValue, valid=None) -> TensorValue:
    return TensorValue(_as(data, storage_dtype(dtype)), dtype, valid, like.is_tile)


def _truthy(cond) -> bool:
    if isinstance(cond, TensorValue):
        return bool(cond.data.reshape(-1)[0].item())
    return bool(cond)


def _accumulate(name: str, acc: TensorValue, prod: torch.Tensor, operands, init_cond=None) -> TensorValue:
    """acc + prod (or prod when init_cond holds) in the accumulator's dtype, keeping acc's valid box."""
    want = _acc_dtype(*operands)
    if acc.dtype != want:
        raise OpError(f"pl.{name}: the accumulator must be {want!r} for {operands[0].dtype!r} operands "
                      f"(FP32 for float, INT32 for integer), got acc {acc.dtype!r} {_shape(acc)}")
    if tuple(prod.shape) != acc.shape:
        raise OpError(f"pl.{name}: acc {_shape(acc)} does not match the product shape {list(prod.shape)} of "
                      f"lhs {_shape(operands[0])} and rhs {_shape(operands[1])}")
    total = prod if init_cond is not None and _truthy(init_cond) else _as(acc.data, prod.dtype) + prod
    return TensorValue(_as(total, storage_dtype(acc.dtype)), acc.dtype, acc.valid, acc.is_tile)


def _same_dtype(name: str, lhs: TensorValue, rhs: TensorValue) -> None:
    if lhs.dtype != rhs.dtype:
        raise OpError(f"pl.{name}: lhs and rhs must have the same dtype, got {lhs.dtype!r} {_shape(lhs)} and "
                      f"{rhs.dtype!r} {_shape(rhs)}")


def _two_d(name: str, **values) -> None:
    for arg, v in values.items():
        if v.ndim != 2:
            raise OpError(f"pl.{name}: `{arg}` must be 2-D, got {_shape(v)}")


# ----------------------------------------------------------------------------------- tensor forms
@op("matmul", "tensor.matmul", shape=Shape.MATMUL, coalesce=ANY_DIM)
def matmul(lhs, rhs, out_dtype=None, a_trans=False, b_trans=False, c_matrix_nz=False):
    _check_operands("matmul", lhs=lhs, rhs=rhs)
    prod = _product("matmul", lhs, rhs, a_trans, b_trans)
    dtype = _acc_dtype(lhs, rhs) if out_dtype is None else to_dtype(out_dtype)
    return _result(prod, dtype, lhs if lhs.is_tile else rhs)


@op("matmul_acc", "tensor.matmul_acc", shape=Shape.FIRST, coalesce=ANY_DIM)
def matmul_acc(acc, lhs, rhs, a_trans=False, b_trans=False, init_cond=None):
    _check_operands("matmul_acc", acc=acc, lhs=lhs, rhs=rhs)
    prod = _product("matmul_acc", lhs, rhs, a_trans, b_trans)
    return _accumulate("matmul_acc", acc, prod, (lhs, rhs), init_cond)


# ------------------------------------------------------------------------------------- tile forms
@op("tile.matmul", shape=Shape.MATMUL, coalesce=ANY_DIM)
def tile_matmul(lhs, rhs):
    _check_operands("tile.matmul", lhs=lhs, rhs=rhs)
    _two_d("tile.matmul", lhs=lhs, rhs=rhs)
    _same_dtype("tile.matmul", lhs, rhs)
    return _result(_product("tile.matmul", lhs, rhs), _acc_dtype(lhs), lhs)


@op("tile.matmul_acc", shape=Shape.FIRST, coalesce=ANY_DIM)
def tile_matmul_acc(acc, lhs, rhs, init_cond=None):
    _check_operands("tile.matmul_acc", acc=acc, lhs=lhs, rhs=rhs)
    _two_d("tile.matmul_acc", acc=acc, lhs=lhs, rhs=rhs)
    _same_dtype("tile.matmul_acc", lhs, rhs)
    return _accumulate("tile.matmul_acc", acc, _product("tile.matmul_acc", lhs, rhs), (lhs, rhs), init_cond)


def _add_bias(name: str, prod: torch.Tensor, bias: TensorValue) -> torch.Tensor:
    n = prod.shape[-1]
    if bias.shape not in ((1, n), (n,)):
        raise OpError(f"pl.{name}: bias must be [1, {n}] (one row of the output width), got {_shape(bias)}")
    return prod + _padded(bias, prod.dtype).reshape(n)


@op("matmul_bias", "tile.matmul_bias")
def matmul_bias(lhs, rhs, bias):
    _check_operands("matmul_bias", lhs=lhs, rhs=rhs, bias=bias)
    _two_d("matmul_bias", lhs=lhs, rhs=rhs)
    _same_dtype("matmul_bias", lhs, rhs)
    prod = _add_bias("matmul_bias", _product("matmul_bias", lhs, rhs), bias)
    return _result(prod, _acc_dtype(lhs), lhs)


@op("batch_matmul", "tile.batch_matmul")
def batch_matmul(lhs, rhs):
    _check_operands("batch_matmul", lhs=lhs, rhs=rhs)
    if lhs.ndim < 2 or rhs.ndim < 2:
        raise OpError(f"pl.batch_matmul: operands must be at least 2-D, got lhs {_shape(lhs)}, rhs {_shape(rhs)}")
    _same_dtype("batch_matmul", lhs, rhs)
    return _result(_product("batch_matmul", lhs, rhs), _acc_dtype(lhs), lhs)


@op("tile.batch_matmul_acc")
def batch_matmul_acc(acc, lhs, rhs):
    _check_operands("tile.batch_matmul_acc", acc=acc, lhs=lhs, rhs=rhs)
    _same_dtype("tile.batch_matmul_acc", lhs, rhs)
    prod = _product("tile.batch_matmul_acc", lhs, rhs)
    return _accumulate("tile.batch_matmul_acc", acc, prod, (lhs, rhs))


# ------------------------------------------------------------------------------------------- gemv
def _gemv_product(name: str, lhs, rhs, acc_phase) -> torch.Tensor:
    _two_d(name, lhs=lhs, rhs=rhs)
    _same_dtype(name, lhs, rhs)
    if lhs.dtype not in _GEMV_DTYPES:
        raise OpError(f"pl.{name}: operands must be INT8, FP16, BF16 or FP32, got {lhs.dtype!r}")
    if lhs.shape[0] != 1:
        raise OpError(f"pl.{name}: lhs must be one row [1, K], got {_shape(lhs)}; use pl.matmul for more rows")
    if acc_phase not in _ACC_PHASES:
        raise OpError(f"pl.{name}: acc_phase must be 'unspecified', 'partial' or 'final', got {acc_phase!r}")
    return _product(name, lhs, rhs)


@op("gemv", "tile.gemv")
def gemv(lhs, rhs, acc_phase=None):
    _check_operands("gemv", lhs=lhs, rhs=rhs)
    return _result(_gemv_product("gemv", lhs, rhs, acc_phase), _acc_dtype(lhs), lhs)


@op("gemv_acc", "tile.gemv_acc")
def gemv_acc(acc, lhs, rhs, acc_phase=None):
    _check_operands("gemv_acc", acc=acc, lhs=lhs, rhs=rhs)
    prod = _gemv_product("gemv_acc", lhs, rhs, acc_phase)
    return _accumulate("gemv_acc", acc, prod, (lhs, rhs))


@op("gemv_bias", "tile.gemv_bias")
def gemv_bias(lhs, rhs, bias, acc_phase=None):
    _check_operands("gemv_bias", lhs=lhs, rhs=rhs, bias=bias)
    prod = _add_bias("gemv_bias", _gemv_product("gemv_bias", lhs, rhs, acc_phase), bias)
    return _result(prod, _acc_dtype(lhs), lhs)


not_supported("matmul_mx", "tile.matmul_mx", "matmul_mx_acc", "tile.matmul_mx_acc", "matmul_mx_bias",
              "tile.matmul_mx_bias", why="A5 MX FP8 block-scale matmul")
