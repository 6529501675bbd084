"""Elementwise ops: arithmetic, math, compare/select, bitwise, and the scalar `pl.min`/`pl.max` (spec §4.3).

Binary ops take a tensor/tile first and a tensor/tile or Python number second; tensor operands broadcast
numpy-style. The result dtype follows `promote` (§3.4) except where the spec pins the lhs dtype (`subs`,
bitwise and shift forms); math runs in FP32 for every float dtype and in int64 for every integer dtype, then
the result is stored in `storage_dtype(result)` (unsigned types wrap to their width). Valid boxes follow §3.3:
unary ops and tensor-scalar ops keep the (lhs) box; tensor-tensor ops keep it only when both operands have the
same shape and box, else the result is fully valid; `cmp` never propagates one. Integer division or remainder
by zero gives 0 (undefined on device; the pad outside a valid box may hold zeros). Tile scratch arguments
(`tmp`) are accepted and ignored. Mixing a Tensor with a Tile is not rejected here (the CPU result is the same).
"""
from __future__ import annotations

import builtins
import numbers

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops.dtype_rules import promote, scalar_dtype, storage_dtype
from pypto_rt.ops.flush import exp_ftz
from pypto_rt.ops.registry import op
from pypto_rt.ops.recording import ScalarFromData, less
from pypto_rt.ops.value import TensorValue, broadcast_shape, valid_mask


def _all(name: str) -> tuple[str, str, str]:
    return name, f"tensor.{name}", f"tile.{name}"


def _tile(name: str) -> tuple[str, str]:
    return name, f"tile.{name}"


# ----------------------------------------------------------------------------------------------- helpers

def _is_scalar(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, TensorValue)


def _describe(x) -> str:
    return repr(x) if isinstance(x, TensorValue) else type(x).__name__


def _need_value(name: str, x, what: str = "operand") -> None:
    if not isinstance(x, TensorValue):
        hint = "put the tensor first" if _is_scalar(x) else None
        raise OpError(f"pl.{name}: the {what} must be a tensor or tile, got {_describe(x)}", hint=hint)


def _need_operand(name: str, x) -> None:
    if not (isinstance(x, TensorValue) or _is_scalar(x)):
        raise OpError(f"pl.{name}: the second operand must be a tensor, a tile or a number, got {_describe(x)}")


def _need_scalar(name: str, x, plain: str) -> None:
    if not _is_scalar(x):
        raise OpError(f"pl.{name} takes a scalar second operand, got {_describe(x)}",
                      hint=f"use pl.{plain} for two tensors")


def _dtype_of(x):
    return x.dtype if isinstance(x, TensorValue) else scalar_dtype(x)


def _compute_dtype(dtype) -> torch.dtype:
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


def _store(data: torch.Tensor, dtype) -> torch.Tensor:
    """Convert computed values to the storage of `dtype`; UINT16/UINT32 (stored wider) wrap to their width."""
    if dtype in (D.UINT16, D.UINT32):
        data = data.to(torch.int64) & ((1 << dtype.bits) - 1)
    storage = storage_dtype(dtype)
    return data if data.dtype is storage else data.to(storage)


_TAKES_PY_SCALAR = (torch.add, torch.sub, torch.mul)


def _check_broadcast(name: str, a: TensorValue, b) -> None:
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


def _binary(name, a, b, fn, *, keep_lhs=False, out_dtype=None, valid="auto"):
    """Apply `fn` to (a, b) in the compute dtype of their promoted (or lhs) dtype."""
    if type(a) is TensorValue and a.dtype is D.FP32 and out_dtype is None and valid == "auto":
        fast = _binary_fp32(a, b, fn)   # the common case, with the same result as the general path below
        if fast is not None:
            return fast
    _need_value(name, a, "first operand")
    _need_operand(name, b)
    _check_broadcast(name, a, b)
    dtype = a.dtype if keep_lhs else promote(a.dtype, _dtype_of(b))
    cdt = _compute_dtype(dtype)
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
    return TensorValue(_store(out, result), result, box, is_tile)


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


def _unary(name, x, fn, *, float_only=False, fp32_only=False):
    _need_value(name, x, "input")
    if (float_only and not x.dtype.is_float()) or (fp32_only and x.dtype != D.FP32):
        kind = "an FP32" if fp32_only else "a float"
        raise OpError(f"pl.{name} needs {kind} input, got {x.dtype!r}", hint="pl.cast it to pl.FP32 first")
    data = x.data
    cdt = _compute_dtype(x.dtype)
    return x.derive(_store(fn(data if data.dtype is cdt else data.to(cdt)), x.dtype))


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

@op(*_all("add"))
def add(lhs, rhs):
    if _is_scalar(lhs) and _is_scalar(rhs):
        return lhs + rhs
    return _binary("add", lhs, rhs, torch.add)


@op(*_all("sub"))
def sub(lhs, rhs):
    if _is_scalar(lhs) and _is_scalar(rhs):
        return lhs - rhs
    return _binary("sub", lhs, rhs, torch.sub, keep_lhs=_is_scalar(rhs))  # subs keeps the lhs dtype


@op(*_all("mul"))
def mul(lhs, rhs):
    if _is_scalar(lhs) and _is_scalar(rhs):
        return lhs * rhs
    return _binary("mul", lhs, rhs, torch.mul)


@op(*_all("div"))
def div(lhs, rhs, high_precision=False):
    """True division for floats, truncating division for integers; `high_precision` is a hint only."""
    if _is_scalar(lhs) and _is_scalar(rhs):
        return lhs / rhs
    return _binary("div", lhs, rhs, _div)


def _tail(fn, name, names, doc):
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return op(*names)(fn)


def _binary_op(name, fn, doc, names=None):
    """A tensor-or-scalar second operand form (`maximum`, `fmod`, ...)."""
    def impl(lhs, rhs):
        return _binary(name, lhs, rhs, fn)
    return _tail(impl, name, names or _all(name), doc)


def _two_operand_impl(run, tmp: bool):
    """`impl(lhs, rhs)` calling `run`, with an ignored tile scratch `tmp=None` parameter when `tmp`."""
    if tmp:
        def impl(lhs, rhs, tmp=None):
            return run(lhs, rhs)
    else:
        def impl(lhs, rhs):
            return run(lhs, rhs)
    return impl


def _scalar_op(name, plain, fn, doc, *, keep_lhs=False, names=None, tmp=False):
    """A scalar-only second operand form (`adds`, `maximums`, ...); tile scratch `tmp` ignored."""
    def run(lhs, rhs):
        _need_scalar(name, rhs, plain)
        return _binary(name, lhs, rhs, fn, keep_lhs=keep_lhs)
    impl = _two_operand_impl(run, tmp)
    return _tail(impl, name, names or _all(name), doc)


adds = _scalar_op("adds", "add", torch.add, "x + scalar (promoted dtype).")
subs = _scalar_op("subs", "sub", torch.sub, "x - scalar; keeps x's dtype.", keep_lhs=True)
muls = _scalar_op("muls", "mul", torch.mul, "x * scalar (promoted dtype).")
divs = _scalar_op("divs", "div", _div, "x / scalar (promoted dtype).")
maximum = _binary_op("maximum", torch.maximum, "Elementwise max; the rhs may be a number (relu: rhs 0.0).")
minimum = _binary_op("minimum", torch.minimum, "Elementwise min; the rhs may be a number.")
maximums = _scalar_op("maximums", "maximum", torch.maximum, "max(x, scalar).",
                      names=("maximums", "tile.maximums", "maxs"))
minimums = _scalar_op("minimums", "minimum", torch.minimum, "min(x, scalar).",
                      names=("minimums", "tile.minimums", "mins"))
fmod = _binary_op("fmod", _fmod, "Remainder with the sign of the dividend (torch.fmod).")
fmods = _scalar_op("fmods", "fmod", _fmod, "fmod(x, scalar).")
rems = _scalar_op("rems", "rem", _rem, "x % scalar (sign of the divisor).", names=_tile("rems"), tmp=True)


@op(*_tile("rem"))
def rem(lhs, rhs, tmp=None):
    """Python `%`: remainder with the sign of the divisor."""
    return _binary("rem", lhs, rhs, _rem)


def _carry_op(name, first, doc, scalar=False):
    """`addc`/`subc` (lhs, rhs, carry) and `addsc`/`subsc` (lhs, scalar, carry): two rounded steps on device."""
    def run(lhs, rhs, carry):
        if scalar:
            _need_scalar(name, rhs, name[:3] + "c")
        step = _binary(name, lhs, rhs, first, keep_lhs=scalar and first is torch.sub)
        return _binary(name, step, carry, torch.add)
    if scalar:
        def impl(lhs, scalar, carry):
            return run(lhs, scalar, carry)
    else:
        def impl(lhs, rhs, carry):
            return run(lhs, rhs, carry)
    return _tail(impl, name, _tile(name), doc)


addc = _carry_op("addc", torch.add, "lhs + rhs + carry.")
subc = _carry_op("subc", torch.sub, "lhs - rhs + carry.")
addsc = _carry_op("addsc", torch.add, "lhs + scalar + carry.", scalar=True)
subsc = _carry_op("subsc", torch.sub, "lhs - scalar + carry.", scalar=True)


def _part(name, lhs, rhs, fn):
    """Op where both operands are valid, the valid one where only one is; result box = union's extent."""
    _need_value(name, lhs, "first operand")
    _need_value(name, rhs, "second operand")
    if lhs.shape != rhs.shape:
        raise OpError(f"pl.{name}: operand shapes {list(lhs.shape)} and {list(rhs.shape)} differ",
                      hint="part_* ops need equal physical shapes; only the valid boxes may differ")
    dtype = promote(lhs.dtype, rhs.dtype)
    cdt = _compute_dtype(dtype)
    a, b = lhs.data.to(cdt), rhs.data.to(cdt)
    both = fn(a, b)
    ma = valid_mask(lhs) if lhs.valid is not None else torch.ones((), dtype=torch.bool)
    mb = valid_mask(rhs) if rhs.valid is not None else torch.ones((), dtype=torch.bool)
    out = torch.where(ma & mb, both, torch.where(ma, a, torch.where(mb, b, both)))
    box = tuple(builtins.max(x, y) for x, y in zip(lhs.valid_shape, rhs.valid_shape))
    return TensorValue(_store(out, dtype), dtype, box, lhs.is_tile or rhs.is_tile)


def _part_op(name, fn):
    def impl(lhs, rhs):
        return _part(name, lhs, rhs, fn)
    return _tail(impl, name, _all(name), f"{name}: the op where both are valid, else the valid operand.")


part_add = _part_op("part_add", torch.add)
part_mul = _part_op("part_mul", torch.mul)
part_max = _part_op("part_max", torch.maximum)
part_min = _part_op("part_min", torch.minimum)


# ------------------------------------------------------------------------------------------ unary

def _unary_op(name, fn, doc, *, hp=False, names=None, **checks):
    """A one-input op; `hp` adds the `high_precision=False` hint (ignored: torch is already precise)."""
    if hp:
        def impl(input, high_precision=False):
            return _unary(name, input, fn, **checks)
    else:
        def impl(input):
            return _unary(name, input, fn, **checks)
    return _tail(impl, name, names or _all(name), doc)


neg = _unary_op("neg", torch.neg, "-x.")
abs = _unary_op("abs", torch.abs, "|x|.")  # noqa: A001  (pl.abs)
exp = _unary_op("exp", exp_ftz, "e**x (float inputs; subnormal results flush to 0, see ops/flush.py).",
                float_only=True)
log = _unary_op("log", torch.log, "Natural log (float inputs).", float_only=True, hp=True)
sqrt = _unary_op("sqrt", torch.sqrt, "Square root (float inputs).", float_only=True)
recip = _unary_op("recip", torch.reciprocal, "1 / x (float inputs).", float_only=True, hp=True)
relu = _unary_op("relu", torch.relu, "max(x, 0).", names=_tile("relu"))
sin = _unary_op("sin", torch.sin, "sin(x) (FP32 only).", fp32_only=True)
cos = _unary_op("cos", torch.cos, "cos(x) (FP32 only).", fp32_only=True)


@op(*_all("rsqrt"))
def rsqrt(input, high_precision=False):
    """`pl.tile.rsqrt(tile, tmp)` passes a scratch tile positionally; `high_precision=True` is tensor-only."""
    if isinstance(input, TensorValue) and input.is_tile and high_precision is True:
        raise OpError("pl.rsqrt: high_precision is not supported for Tile operands",
                      hint="the tile form selects precision by taking a scratch tile: pl.tile.rsqrt(tile, tmp)")
    return _unary("rsqrt", input, torch.rsqrt, float_only=True)


@op(*_tile("lrelu"))
def lrelu(input, slope):
    """where(x > 0, x, x * slope) with a scalar slope."""
    _need_scalar("lrelu", slope, "prelu")
    return _binary("lrelu", input, slope, lambda x, s: torch.where(x > 0, x, x * s), keep_lhs=True)


@op(*_tile("prelu"))
def prelu(input, slope, tmp=None):
    """where(x > 0, x, x * slope) with a tensor (broadcast) or scalar slope; keeps the input dtype."""
    return _binary("prelu", input, slope, lambda x, s: torch.where(x > 0, x, x * s), keep_lhs=True,
                   valid=input.valid if isinstance(input, TensorValue) else None)


# ------------------------------------------------------------------------------- compare / select

_CMP = (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge)
_CMP_NAMES = {"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5}


def _cmp_fn(name: str, cmp_type):
    code = _CMP_NAMES.get(cmp_type.lower(), -1) if isinstance(cmp_type, str) else cmp_type
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 5:
        raise OpError(f"pl.{name}: cmp_type must be 0..5 (eq, ne, lt, le, gt, ge), got {cmp_type!r}")
    return _CMP[code]


def _compare(name, lhs, rhs, cmp_type):
    """Tensor form: numeric 0/1 in the promoted operand dtype. Tile form: a BOOL mask for pl.sel."""
    fn = _cmp_fn(name, cmp_type)
    _need_value(name, lhs, "first operand")
    out_dtype = D.BOOL if lhs.is_tile else promote(lhs.dtype, _dtype_of(rhs))
    return _binary(name, lhs, rhs, fn, out_dtype=out_dtype, valid=None)


@op(*_all("cmp"))
def cmp(lhs, rhs, cmp_type=0):
    return _compare("cmp", lhs, rhs, cmp_type)


@op(*_tile("cmps"))
def cmps(lhs, rhs, cmp_type=0):
    _need_scalar("cmps", rhs, "cmp")
    return _compare("cmps", lhs, rhs, cmp_type)


def _mask(name: str, mask, shape) -> torch.Tensor:
    _need_value(name, mask, "mask")
    try:
        broadcast_shape(mask.shape, shape)
    except ValueError:
        raise OpError(f"pl.{name}: mask shape {list(mask.shape)} does not match operand shape {list(shape)}") \
            from None
    return mask.data != 0


@op(*_tile("sel"))
def sel(mask, lhs, rhs, tmp=None):
    """where(mask, lhs, rhs); the result keeps lhs's valid box."""
    _need_value("sel", lhs, "lhs")
    m = _mask("sel", mask, lhs.shape)
    return _binary("sel", lhs, rhs, lambda a, b: torch.where(m, a, b), valid=lhs.valid)


@op(*_tile("sels"))
def sels(mask, src, tmp=None, scalar=None):
    """where(mask, src, scalar); keeps src's dtype and valid box."""
    _need_value("sels", src, "src")
    _need_scalar("sels", scalar, "sel")
    m = _mask("sels", mask, src.shape)
    return _binary("sels", src, scalar, lambda a, b: torch.where(m, a, b), keep_lhs=True)


# --------------------------------------------------------------------------------------- bitwise

def _int_value(name: str, x) -> None:
    if not (x.dtype.is_int() or x.dtype == D.BOOL):
        raise OpError(f"pl.{name} needs an integer tensor, got {x.dtype!r}", hint="pl.cast it to pl.INT32 first")


def _bitwise(name, lhs, rhs, fn, shift=False):
    """Integer-only, no broadcasting, same dtypes; the result keeps the lhs dtype."""
    _need_value(name, lhs, "first operand")
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
    return _binary(name, lhs, rhs, fn, keep_lhs=True)


def _bitwise_op(name, fn, *, shift=False, scalar=False, tmp=False):
    """`and_`/`or_`/`xor`/`shl`/`shr` (tensor or integer rhs) and their scalar-only `*s` forms."""
    def run(lhs, rhs):
        if scalar and isinstance(rhs, TensorValue):
            raise OpError(f"pl.{name} takes an integer scalar second operand, got {rhs!r}",
                          hint=f"use pl.{name[:-1]}{'_' if name in ('ands', 'ors') else ''} for two tensors")
        return _bitwise(name, lhs, rhs, fn, shift)
    impl = _two_operand_impl(run, tmp)
    return _tail(impl, name, _all(name), f"Bitwise {name.rstrip('s_')} (integers; keeps the lhs dtype).")


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


@op(*_all("not_"))
def not_(input):
    """Bitwise NOT; INT16/UINT16 only (the hardware instruction's types)."""
    _need_value("not_", input, "input")
    if input.dtype not in (D.INT16, D.UINT16):
        raise OpError(f"pl.not_ supports INT16 and UINT16 only, got {input.dtype!r}",
                      hint="pl.xors(x, -1) inverts other integer types")
    return _unary("not_", input, torch.bitwise_not)


# ------------------------------------------------------------------------------ scalar min / max

def _scalar_pair(name: str, a, b) -> None:
    for x in (a, b):
        if not _is_scalar(x):
            what = "row_min / pl.minimum" if name == "min" else "row_max / pl.maximum"
            raise OpError(f"pl.{name} is the scalar {name}imum of two numbers, got {_describe(x)}",
                          hint=f"for tensors use pl.{what}")


@op("min")
def scalar_min(a, b):
    """pl.min(a, b): minimum of two scalars (not a reduction)."""
    _scalar_pair("min", a, b)
    return b if less(b, a) else a   # as builtins.min (the first of equal ones), also for numbers read from data


@op("max")
def scalar_max(a, b):
    """pl.max(a, b): maximum of two scalars (not a reduction)."""
    _scalar_pair("max", a, b)
    return b if less(a, b) else a
