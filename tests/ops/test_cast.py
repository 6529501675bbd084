"""pl.cast: rounding modes (ties!), saturation, FP32 -> BF16/FP16 narrowing, the int8 quant chain, scalars."""
import math
import struct

import numpy as np
import pytest
import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import CastMode
from pypto_rt.ops import cast as C
from pypto_rt.ops.value import TensorValue


def f32(values, valid=None, tile=False):
    return TensorValue(torch.tensor(values, dtype=torch.float32), D.FP32, valid, tile)


def from_bits(bits, dtype=torch.float32, view=torch.int32):
    return torch.tensor(bits, dtype=torch.int64).to(view).view(dtype)


def bits16(t):
    return t.view(torch.int16).to(torch.int64).bitwise_and(0xFFFF).tolist()


TIES = [2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 3.5, 1e6 + 0.5]


def half_away(x):  # independent reference: nearest, ties away from zero
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


# ---------------------------------------------------------------------------------------- float -> int

def test_round_vs_rint_on_exact_ties():
    x = f32(TIES)
    rounded = C.cast(x, D.INT32).data.tolist()  # default mode = "round"
    rinted = C.cast(x, D.INT32, "rint").data.tolist()
    assert rounded == [half_away(v) for v in TIES]
    assert rinted == [round(v) for v in TIES]  # Python round() is ties-to-even
    assert rounded[:2] == [3, -3] and rinted[:2] == [2, -2]


@pytest.mark.parametrize("mode, ref", [("floor", math.floor), ("ceil", math.ceil), ("trunc", math.trunc),
                                       ("none", round), (1, round), (CastMode.round, half_away)])
def test_directed_modes(mode, ref):
    values = [2.5, -2.5, 2.4, -2.6, 0.0, 7.0, -0.7]
    assert C.cast(f32(values), D.INT32, mode).data.tolist() == [ref(v) for v in values]


def test_odd_mode_ties_to_odd():
    values = [2.5, 3.5, -2.5, -3.5, 0.5, 2.4, 2.6]
    # a tie k + 0.5 goes to whichever of k, k+1 is odd; non-ties go to the nearest
    expected = [3, 3, -3, -3, 1, 2, 3]
    assert C.cast(f32(values), D.INT32, "odd").data.tolist() == expected


def test_float_to_int_saturates():
    values = [1e10, -1e10, math.inf, -math.inf, math.nan, 127.4, -300.0]
    assert C.cast(f32(values), D.INT32).data.tolist() == [2**31 - 1, -2**31, 2**31 - 1, -2**31, 0, 127, -300]
    assert C.cast(f32(values), D.INT8).data.tolist() == [127, -128, 127, -128, 0, 127, -128]
    out = C.cast(f32([-5.0, 300.0, 7.6]), D.UINT8)
    assert out.data.dtype == torch.uint8 and out.data.tolist() == [0, 255, 8]


def test_unsigned_targets_use_wider_storage():
    out = C.cast(f32([1.0, 5e9, -3.0]), D.UINT32)
    assert out.dtype == D.UINT32 and out.data.dtype == torch.int64
    assert out.data.tolist() == [1, 2**32 - 1, 0]


def test_int_to_int_saturates():
    x = TensorValue(torch.tensor([-1000, -5, 0, 5, 1000], dtype=torch.int32), D.INT32)
    assert C.cast(x, D.INT8).data.tolist() == [-128, -5, 0, 5, 127]
    assert C.cast(x, D.INDEX).data.dtype == torch.int64


# ------------------------------------------------------------------------------------- FP32 -> BF16

def _bf16_tie_bits(bf16_bits):
    """FP32 bit patterns exactly halfway between bf16 value `bf16_bits` and the next one up in magnitude."""
    return [(b << 16) | 0x8000 for b in bf16_bits]


@pytest.mark.parametrize("sign", [0, 1])
def test_fp32_to_bf16_ties_from_bit_patterns(sign):
    even, odd = 0x3F80, 0x3F81  # 1.0 (even mantissa) and 1.0078125 (odd mantissa)
    mags = [even, odd, 0x0001, 0x7F7E]  # + a subnormal and the one below max
    bits = [(sign << 15 | m) for m in mags]
    x = from_bits(_bf16_tie_bits(bits))
    rounded = bits16(C.cast(TensorValue(x, D.FP32), D.BF16).data)
    rinted = bits16(C.cast(TensorValue(x, D.FP32), D.BF16, "rint").data)
    # ties away from zero: the magnitude always steps up
    assert rounded == [b + 1 for b in bits]
    # ties to even: the even magnitude stays, the odd one steps up
    assert rinted == [b + (m & 1) for b, m in zip(bits, mags)]
    assert rinted == bits16(x.to(torch.bfloat16))


def test_fp32_to_bf16_round_matches_the_spec_bit_rule():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 1 << 32, (200_000,), generator=gen, dtype=torch.int64)
    raw[::3] = (raw[::3] & ~0xFFFF) | 0x8000  # plenty of exact ties
    x = raw.to(torch.int32).view(torch.float32)
    raw, x = raw[~torch.isnan(x)], x[~torch.isnan(x)]
    sign, mag = raw & 0x80000000, raw & 0x7FFFFFFF
    expected = ((sign | (mag + 0x8000)) >> 16) & 0xFFFF  # add 0x8000 to the magnitude bits, truncate
    assert bits16(C.cast(TensorValue(x, D.FP32), D.BF16).data) == expected.tolist()


def test_fp32_to_bf16_non_ties_agree_with_torch_and_directed_modes_bracket():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(1)) * 1e3
    v = TensorValue(x, D.FP32)
    assert torch.equal(C.cast(v, D.BF16).data, x.to(torch.bfloat16))  # randn has no exact ties
    trunc = C.cast(v, D.BF16, "trunc").data
    assert bits16(trunc) == ((x.view(torch.int32).to(torch.int64) >> 16) & 0xFFFF).tolist()
    floor, ceil = C.cast(v, D.BF16, "floor").data.double(), C.cast(v, D.BF16, "ceil").data.double()
    assert bool((floor <= x.double()).all()) and bool((ceil >= x.double()).all())
    assert bool(((ceil - floor) <= (x.double().abs() * 2.0**-7)).all())


def test_fp32_to_bf16_overflow():
    big = float(torch.finfo(torch.bfloat16).max)
    x = f32([3.4e38, -3.4e38, math.inf, math.nan])
    out = C.cast(x, D.BF16).data
    assert out[0] == math.inf and out[1] == -math.inf and out[2] == math.inf and math.isnan(out[3])
    assert C.cast(x, D.BF16, "trunc").data[:2].tolist() == [big, -big]


# ------------------------------------------------------------------------------------- FP32 -> FP16

def test_fp32_to_fp16_ties():
    lows = np.array([1.0, 2049.0 / 2048, 1000.0, 6.0e-5], dtype=np.float16)  # both even and odd mantissas
    ups = np.nextafter(lows, np.float16(np.inf))
    mids = (lows.astype(np.float64) + ups.astype(np.float64)) / 2  # exact in FP32 (12 significant bits)
    for sign in (1, -1):
        x = TensorValue(torch.tensor(sign * mids, dtype=torch.float32), D.FP32)
        rounded = C.cast(x, D.FP16).data.double().numpy()
        rinted = C.cast(x, D.FP16, "rint").data.double().numpy()
        assert (rounded == sign * ups.astype(np.float64)).all()  # away from zero = the larger magnitude
        assert (rinted == (sign * mids).astype(np.float16).astype(np.float64)).all()  # numpy is RNE
        assert not (rounded == rinted).all()


def test_int_to_bf16_tie():
    # 257 lies halfway between the BF16 values 256 (even mantissa) and 258 (odd mantissa)
    x = TensorValue(torch.tensor([257, -257, 259], dtype=torch.int32), D.INT32)
    assert C.cast(x, D.BF16, "rint").data.tolist() == [256.0, -256.0, 260.0]
    assert C.cast(x, D.BF16).data.tolist() == [258.0, -258.0, 260.0]


# ------------------------------------------------------------------------------------ chains / general

def test_int8_quant_chain_matches_golden_idiom():
    gen = torch.Generator().manual_seed(2)
    x = (torch.rand(64, 64, generator=gen) * 254 - 127)
    x[0, :6] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 126.5])  # exact ties: rint must be ties-to-even
    i32 = C.cast(TensorValue(x, D.FP32), D.INT32, mode="rint")
    h = C.cast(i32, D.FP16, mode="round")
    q = C.cast(h, D.INT8, mode="trunc")
    golden = torch.round(x).to(torch.int32).to(torch.float16).to(torch.int8)
    assert q.dtype == D.INT8 and torch.equal(q.data, golden)


def test_keeps_shape_valid_box_and_kind():
    x = f32([[1.5, 2.5, 3.5], [4.5, 5.5, 6.5]], valid=(2, 1), tile=True)
    for target in (D.BF16, D.INT32, D.FP16):
        out = C.cast(x, target)
        assert out.shape == (2, 3) and out.valid == (2, 1) and out.is_tile and out.dtype == target


def test_same_dtype_is_an_identity_copy():
    x = f32([1.0, 2.0])
    out = C.cast(x, D.FP32)
    assert torch.equal(out.data, x.data) and out.data.data_ptr() != x.data.data_ptr()


def test_widening_and_bool():
    x = TensorValue(torch.tensor([1.5, -2.25], dtype=torch.bfloat16), D.BF16)
    assert C.cast(x, D.FP32).data.tolist() == [1.5, -2.25]
    assert C.cast(f32([0.0, 2.0]), D.BOOL).data.tolist() == [False, True]
    assert C.cast(C.cast(f32([0.0, 2.0]), D.BOOL), D.INT32).data.tolist() == [0, 1]


def test_bad_mode_and_target():
    with pytest.raises(OpError, match="mode"):
        C.cast(f32([1.0]), D.INT32, mode="nearest")
    with pytest.raises(OpError, match="mode"):
        C.cast(f32([1.0]), D.INT32, mode=9)
    with pytest.raises(OpError):
        C.cast(f32([1.0]), "fp32")


# -------------------------------------------------------------------------------------------- scalars

def test_scalar_casts():
    assert C.cast(3.7, D.INT32) == 3 and C.cast(-3.7, D.INT32) == -3  # C conversion truncates
    assert C.cast(7, D.INDEX) == 7 and isinstance(C.cast(7.0, D.INDEX), int)
    assert C.cast(0.1, D.FP32) == struct.unpack("f", struct.pack("f", 0.1))[0]
    assert C.cast(0.1, D.BF16) == float(torch.tensor(0.1, dtype=torch.float32).to(torch.bfloat16))
    assert C.cast(-1, D.UINT32) == 2**32 - 1 and C.cast(300, D.INT8) == 300 - 256  # ints wrap like C
    assert C.cast(1e20, D.INT32) == 2**31 - 1 and C.cast(math.nan, D.INT32) == 0
    assert C.cast(2, D.BOOL) is True


def test_scalar_cast_rejects_non_default_mode():
    with pytest.raises(OpError, match="default mode"):
        C.cast(2.5, D.INT32, mode="rint")


def test_const():
    assert C.const(5, D.INT32) == 5
    assert C.const(1.0 / 3.0, D.FP32) == struct.unpack("f", struct.pack("f", 1.0 / 3.0))[0]


def _nearest(value: int, dtype: torch.dtype, ties_away: bool) -> float:
    """Independent reference: the representable neighbours of an integer, by exact integer arithmetic."""
    mantissa = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24}[dtype]
    if value == 0:
        return 0.0
    spacing = 2 ** max(0, abs(value).bit_length() - mantissa)
    low = abs(value) // spacing * spacing
    high = low + spacing
    gap_low, gap_high = abs(value) - low, high - abs(value)
    if gap_low != gap_high:
        pick = low if gap_low < gap_high else high
    elif ties_away:
        pick = high
    else:
        pick = low if (low // spacing) % 2 == 0 else high
    limit = torch.finfo(dtype).max
    return math.copysign(math.inf if pick > limit else pick, value)


@pytest.mark.parametrize("target", [D.FP16, D.BF16, D.FP32])
@pytest.mark.parametrize("mode", ["round", "rint"])
def test_integers_round_once_to_float_targets(target, mode):
    """Ties between neighbours (e.g. 2049 -> FP16, 257 -> BF16, 2^24 + 1 -> FP32) go where the mode says."""
    edges = [2049, -2049, 2051, 257, -257, 259, 65519, 65520, 65521, (1 << 24) + 1, (1 << 24) + 3, -(1 << 24) - 1,
             (1 << 31) - 1, -(1 << 31), 0, 1, -1]
    values = torch.tensor(edges + list(range(-5000, 5000, 7)) + torch.randint(-2**31, 2**31, (2000,)).tolist(),
                          dtype=torch.int32)
    got = C.cast(TensorValue(values, D.INT32), target, mode=mode).data.double().tolist()
    for v, g in zip(values.tolist(), got):
        assert g == _nearest(v, {D.FP16: torch.float16, D.BF16: torch.bfloat16, D.FP32: torch.float32}[target],
                             mode == "round"), (v, g)


# ------------------------------------------------------------------ fewer torch calls, the same bits (issue 14)

class _CountCalls:
    """Torch calls made inside the block (a replay repeats each one; attribute reads are not calls)."""

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        class Count(TorchFunctionMode):
            def __torch_function__(mode, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", str(func))
                if name != "__get__":
                    self.names.append(name)
                return func(*args, **(kwargs or {}))
        self.names, self._mode = [], Count()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


_ALL_MODES = ["none", "rint", "round", "floor", "ceil", "trunc", "odd"]


def _float_to_int_reference(x: torch.Tensor, dtype, mode: str) -> torch.Tensor:
    """The general form: round in float64, then saturate there."""
    return C._saturate(C._round_integral(x.to(torch.float64), C._mode(mode)), dtype)


@pytest.mark.parametrize("mode", _ALL_MODES)
def test_float_to_int_in_the_source_format_matches_float64_bit_for_bit(mode):
    """Every FP16 and BF16 bit pattern (NaN, inf, subnormals, ties) to INT8 / UINT8, and FP32 edges and random bit
    patterns to 8- and 16-bit targets, rounded in the source's own format: the float64 form's results."""
    every16 = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    cases = [(every16.view(dt), src, tgt) for dt, src in ((torch.float16, D.FP16), (torch.bfloat16, D.BF16))
             for tgt in (D.INT8, D.UINT8)]
    edges = torch.tensor([0.5, -0.5, 1.5, 2.5, -2.5, 127.5, -128.5, 255.5, 32767.5, -32768.5, 65535.5, 3e9, -3e9,
                          math.inf, -math.inf, math.nan, 1e-45, -0.0], dtype=torch.float32)
    bits = torch.randint(-2**31, 2**31, (20000,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    f32_values = torch.cat([edges, bits.to(torch.int32).view(torch.float32), torch.randn(5000) * 70000])
    cases += [(f32_values, D.FP32, tgt) for tgt in (D.INT8, D.UINT8, D.INT16, D.UINT16, D.INT32)]
    for values, src, tgt in cases:
        got = C.cast(TensorValue(values, src), tgt, mode).data
        assert torch.equal(got, _float_to_int_reference(values, tgt, mode)), (src, tgt)


@pytest.mark.parametrize("src", [D.INT8, D.UINT8, D.INT16, D.UINT16, D.INT32, D.INT64, D.UINT32])
@pytest.mark.parametrize("target", [D.FP16, D.BF16, D.FP32])
@pytest.mark.parametrize("mode", _ALL_MODES)
def test_integer_to_float_fast_forms_match_the_general_rounder(src, target, mode):
    """Each integer source's shortcut (one conversion where no value rounds; RNE plus the moved ties) gives the
    bits of the general bit-stepping rounder, at the range ends, ties and overflow edges and random values."""
    lo, hi = C.int_range(src)
    near = [2049, 2051, 257, 259, 65519, 65520, 65521, (1 << 24) + 1, (1 << 24) + 3, (1 << 31) - 1, 1 << 40,
            (1 << 53) + 1, 0, 1, 127, 128, 255, 256, 32767]
    values = [v for w in near for v in (w, -w, lo, hi, lo + 1, hi - 1) if lo <= v <= hi]
    gen = torch.Generator().manual_seed(7)
    values += torch.randint(max(lo, -2**62), min(hi, 2**62), (3000,), generator=gen).tolist()
    data = torch.tensor(values, dtype=torch.int64).to(C.storage_dtype(src))
    store = C.storage_dtype(target)
    got = C.cast(TensorValue(data, src), target, mode).data
    want = C._round_float(data.to(torch.float64), store, C._mode(mode))
    assert torch.equal(got.view(torch.int16 if store != torch.float32 else torch.int32),
                       want.view(torch.int16 if store != torch.float32 else torch.int32))


@pytest.mark.parametrize("src, target, mode, most", [
    (D.FP32, D.INT32, "trunc", 4),     # float64, NaN -> 0, clamp, convert (it truncates): no rounding step
    (D.FP16, D.INT8, "trunc", 3),      # both ends of INT8 exact in FP16: no float64 hop either
    (D.FP32, D.INT16, "rint", 4),
    (D.INT32, D.INT64, "round", 1),    # every value fits: one conversion, no saturation
    (D.UINT32, D.INT64, "round", 1),   # the same storage: one copy
    (D.INT64, D.INT32, "round", 2),    # saturating, already int64: clamp and convert
    (D.INT8, D.FP32, "round", 1),      # every value exact in the target: no rounding step
    (D.INT16, D.BF16, "rint", 1),
    (D.INT32, D.FP32, "round", 10),    # RNE, then the ties it sent toward zero (20 calls before)
    (D.INT32, D.FP16, "round", 10),
])
def test_casts_make_few_torch_calls(src, target, mode, most):
    data = torch.tensor([0, 1, -1, 100, -100, 7], dtype=torch.int64).to(C.storage_dtype(src))
    if src.is_float():
        data = data.to(C.storage_dtype(src)) + 0.5
    x = TensorValue(data, src)
    with _CountCalls() as counted:
        out = C.cast(x, target, mode)
    assert len(counted.names) <= most, counted.names
    assert out.data.data_ptr() != x.data.data_ptr()    # a cast result never shares the input's memory


def test_same_storage_integer_cast_is_a_copy():
    x = TensorValue(torch.tensor([1, 2, 3], dtype=torch.int64), D.UINT32)
    out = C.cast(x, D.INT64)
    out.data[0] = 9
    assert x.data.tolist() == [1, 2, 3] and out.dtype == D.INT64
