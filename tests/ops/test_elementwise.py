"""Elementwise ops: results against independent torch computations, dtype and valid-box rules (spec §3.3/§3.4)."""
import pytest
import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops import bitwise as B
from pypto_rt.ops import comparison as CS
from pypto_rt.ops import elementwise as E
from pypto_rt.ops import unary as U
from pypto_rt.ops.registry import OPS
from pypto_rt.ops.value import TensorValue


def tv(data, dtype=None, valid=None, tile=False):
    data = torch.as_tensor(data)
    if dtype is None:
        dtype = {torch.float32: D.FP32, torch.bfloat16: D.BF16, torch.float16: D.FP16, torch.int32: D.INT32,
                 torch.int64: D.INT64, torch.int16: D.INT16, torch.int8: D.INT8, torch.bool: D.BOOL}[data.dtype]
    return TensorValue(data, dtype, valid, tile)


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ----------------------------------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("name, ref", [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                                       ("div", torch.div), ("maximum", torch.maximum), ("minimum", torch.minimum)])
def test_fp32_binary_matches_torch(name, ref):
    a, b = rand(8, 16, seed=1), rand(8, 16, seed=2)
    out = OPS[name](tv(a), tv(b))
    assert out.dtype == D.FP32 and out.data.dtype == torch.float32
    torch.testing.assert_close(out.data, ref(a, b), rtol=0, atol=0)


def test_bf16_tensor_ops_compute_in_fp32_and_round_once():
    a, b = rand(16, 32, seed=3, dtype=torch.bfloat16), rand(16, 32, seed=4, dtype=torch.bfloat16)
    out = E.mul(tv(a), tv(b))
    assert out.dtype == D.BF16
    assert torch.equal(out.data, (a.float() * b.float()).to(torch.bfloat16))


def test_bf16_times_python_float_is_fp32():
    a = rand(4, 8, seed=5, dtype=torch.bfloat16)
    out = E.mul(tv(a), 2.0)
    assert out.dtype == D.FP32 and out.data.dtype == torch.float32
    assert torch.equal(out.data, a.float() * 2.0)


def test_int32_plus_python_int_stays_integer():
    a = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    out = E.add(tv(a), 1)
    assert out.dtype.is_int() and not out.data.is_floating_point()
    assert out.dtype == D.INDEX  # INT32 (+) INDEX literal -> the wider 64-bit integer (§3.4)
    assert torch.equal(out.data, a.long() + 1)


def test_int32_plus_python_float_is_fp32():
    a = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    out = E.add(tv(a), 0.5)
    assert out.dtype == D.FP32 and torch.equal(out.data, a.float() + 0.5)


def test_subs_keeps_lhs_dtype_unlike_adds():
    a = rand(4, 4, seed=6, dtype=torch.bfloat16)
    assert E.sub(tv(a), 1.0).dtype == D.BF16  # tensor.subs preserves the lhs dtype
    assert E.subs(tv(a), 1.0).dtype == D.BF16
    assert torch.equal(E.sub(tv(a), 1.0).data, (a.float() - 1.0).to(torch.bfloat16))
    assert E.add(tv(a), 1.0).dtype == D.FP32
    assert E.adds(tv(a), 1.0).dtype == D.FP32


def test_broadcast_row_vector():
    a, b = rand(16, 64, seed=7), rand(1, 64, seed=8)
    out = E.mul(tv(a), tv(b))
    assert out.shape == (16, 64)
    assert torch.equal(out.data, a * b)


def test_bad_shapes_name_the_op_and_both_shapes():
    with pytest.raises(OpError) as err:
        E.add(tv(torch.zeros(16, 64)), tv(torch.zeros(8, 32)))
    msg = str(err.value)
    assert "pl.add" in msg and "[16, 64]" in msg and "[8, 32]" in msg


def test_scalar_forms_reject_tensor_rhs_and_tensor_forms_reject_scalar_lhs():
    with pytest.raises(OpError, match="pl.muls"):
        E.muls(tv(torch.ones(2, 2)), tv(torch.ones(2, 2)))
    with pytest.raises(OpError, match="pl.sub"):
        E.sub(1.0, tv(torch.ones(2, 2)))


def test_scalar_scalar_arithmetic_is_python():
    assert E.add(2, 3) == 5 and E.sub(2, 5) == -3 and E.mul(1.5, 2) == 3.0 and E.div(7, 2) == 3.5


def test_integer_division_truncates_and_zero_divisor_gives_zero():
    a = torch.tensor([7, -7, 7, -7, 5], dtype=torch.int32)
    b = torch.tensor([2, 2, -2, -2, 0], dtype=torch.int32)
    out = E.div(tv(a), tv(b))
    assert out.dtype == D.INT32
    assert out.data.tolist() == [3, -3, -3, 3, 0]  # C division rounds toward zero


def test_fmod_has_sign_of_dividend_rem_of_divisor():
    a = torch.tensor([5.5, -5.5, 5.5, -5.5])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0])
    assert torch.equal(E.fmod(tv(a), tv(b)).data, torch.fmod(a, b))
    assert torch.equal(E.rem(tv(a), tv(b)).data, torch.tensor([x % y for x, y in zip(a.tolist(), b.tolist())]))
    assert torch.equal(E.fmods(tv(a), 2.0).data, torch.fmod(a, 2.0))
    assert torch.equal(E.rems(tv(a), 2.0, None).data, torch.remainder(a, 2.0))


def test_integer_division_by_a_literal_nonzero_int_skips_the_zero_guard():
    """divs / rems / fmods by a nonzero Python int (a block size) make no divisor-0 guard calls (a replay repeats
    each call made), with the guarded form's results; by 0 they still give 0."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    a = torch.tensor([7, -7, 16, 0, -16])
    for op_, want in ((E.divs, torch.div(a, 4, rounding_mode="trunc")), (E.fmods, torch.fmod(a, 4)),
                      (lambda x, s: E.rems(x, s, None), torch.remainder(a, 4))):
        x = tv(a)
        with Count():
            Count.calls = []
            out = op_(x, 4)
        assert torch.equal(out.data, want)
        assert not {"where", "zeros_like", "ones_like"} & set(Count.calls), Count.calls
        assert op_(tv(a), 0).data.tolist() == [0] * 5


def test_unsigned_results_wrap_to_their_width():
    a = TensorValue(torch.tensor([0, 5], dtype=torch.int64), D.UINT32)
    out = E.subs(a, 1)
    assert out.dtype == D.UINT32 and out.data.tolist() == [(1 << 32) - 1, 4]


def test_maximum_with_scalar_and_minimums():
    a = rand(4, 4, seed=9)
    assert torch.equal(E.maximum(tv(a), 0.0).data, torch.clamp_min(a, 0.0))
    assert torch.equal(E.minimums(tv(a), 0.25).data, torch.clamp_max(a, 0.25))
    assert OPS["maxs"] is E.maximums and OPS["mins"] is E.minimums


def test_carry_ops():
    a, b, c = rand(3, 5, seed=10), rand(3, 5, seed=11), rand(3, 5, seed=12)
    assert torch.equal(E.addc(tv(a), tv(b), tv(c)).data, (a + b) + c)
    assert torch.equal(E.subc(tv(a), tv(b), tv(c)).data, (a - b) + c)
    assert torch.equal(E.addsc(tv(a), 2.0, tv(c)).data, (a + 2.0) + c)
    assert torch.equal(E.subsc(tv(a), 2.0, tv(c)).data, (a - 2.0) + c)


def test_part_ops_combine_over_the_union_of_valid_boxes():
    a, b = rand(4, 4, seed=13), rand(4, 4, seed=14)
    out = E.part_add(tv(a, valid=(4, 2)), tv(b, valid=(2, 4)))
    assert out.valid_shape == (4, 4)
    assert torch.equal(out.data[:2, :2], a[:2, :2] + b[:2, :2])  # both valid
    assert torch.equal(out.data[2:, :2], a[2:, :2])  # only a valid
    assert torch.equal(out.data[:2, 2:], b[:2, 2:])  # only b valid


# -------------------------------------------------------------------------------------- valid boxes

def test_unary_keeps_box_and_tensor_scalar_keeps_lhs_box():
    x = tv(rand(8, 8, seed=15).abs() + 0.1, valid=(8, 3), tile=True)
    for out in (U.exp(x), U.neg(x), U.sqrt(x), E.mul(x, 3.0), E.subs(x, 1.0)):
        assert out.valid == (8, 3) and out.is_tile


def test_tensor_tensor_box_kept_only_for_same_shape_and_same_box():
    x = rand(8, 8, seed=16)
    assert E.add(tv(x, valid=(8, 3)), tv(x, valid=(8, 3))).valid == (8, 3)
    assert E.add(tv(x, valid=(8, 3)), tv(x, valid=(8, 4))).valid is None
    assert E.add(tv(x, valid=(8, 3)), tv(x)).valid is None
    assert E.add(tv(x, valid=(8, 3)), tv(rand(1, 8, seed=17))).valid is None


# ---------------------------------------------------------------------------------------------- math

def test_unary_math_matches_torch():
    x = rand(6, 7, seed=18).abs() + 0.5
    for name, ref in (("exp", torch.exp), ("log", torch.log), ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt),
                      ("recip", torch.reciprocal), ("abs", torch.abs), ("neg", torch.neg),
                      ("sin", torch.sin), ("cos", torch.cos), ("relu", torch.relu)):
        assert torch.equal(OPS[name](tv(x)).data, ref(x)), name
    assert torch.equal(U.log(tv(x), high_precision=True).data, torch.log(x))


def test_math_on_bf16_computes_in_fp32():
    x = rand(8, 8, seed=19, dtype=torch.bfloat16)
    out = U.exp(tv(x))
    assert out.dtype == D.BF16 and torch.equal(out.data, torch.exp(x.float()).to(torch.bfloat16))


def test_math_rejects_integers_and_sin_needs_fp32():
    with pytest.raises(OpError, match="pl.exp"):
        U.exp(tv(torch.ones(2, 2, dtype=torch.int32)))
    with pytest.raises(OpError, match="pl.sin"):
        U.sin(tv(torch.ones(2, 2, dtype=torch.bfloat16)))


def test_rsqrt_high_precision_is_tensor_only_but_tile_tmp_is_ignored():
    x = torch.full((2, 2), 4.0)
    with pytest.raises(OpError, match="pl.rsqrt"):
        U.rsqrt(tv(x, tile=True), high_precision=True)
    tmp = tv(torch.zeros(2, 2), tile=True)
    assert torch.equal(OPS["tile.rsqrt"](tv(x, tile=True), tmp).data, torch.full((2, 2), 0.5))


def test_lrelu_and_prelu():
    x = torch.tensor([[-2.0, -0.5, 0.0, 3.0]])
    assert torch.equal(U.lrelu(tv(x), 0.1).data, torch.where(x > 0, x, x * 0.1))
    slope = torch.tensor([[0.5, 0.25, 0.5, 0.5]])
    assert torch.equal(U.prelu(tv(x), tv(slope), None).data, torch.where(x > 0, x, x * slope))


# ------------------------------------------------------------------------------------ compare / select

@pytest.mark.parametrize("code, ref", list(enumerate([torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge])))
def test_cmp_codes(code, ref):
    a = torch.tensor([[1.0, 2.0, 3.0, 2.0]])
    b = torch.tensor([[2.0, 2.0, 2.0, 1.0]])
    out = CS.cmp(tv(a), tv(b), cmp_type=code)
    assert out.dtype == D.FP32  # tensor form: numeric 0/1 in the operand dtype
    assert torch.equal(out.data, ref(a, b).float())
    scalar = CS.cmp(tv(a, valid=(1, 2)), 2.0, code)
    assert torch.equal(scalar.data, ref(a, 2.0).float()) and scalar.valid is None


def test_cmp_rejects_bad_code():
    with pytest.raises(OpError, match="cmp_type"):
        CS.cmp(tv(torch.ones(1, 2)), 1.0, cmp_type=6)


def test_tile_cmp_gives_mask_for_sel_and_sels():
    a, b = rand(4, 8, seed=20, dtype=torch.float16), rand(4, 8, seed=21, dtype=torch.float16)
    mask = CS.cmp(tv(a, tile=True), tv(b, tile=True), 4)
    assert mask.dtype == D.BOOL and mask.is_tile
    picked = CS.sel(mask, tv(a, tile=True), tv(b, tile=True), None)
    assert torch.equal(picked.data, torch.maximum(a, b))
    smask = CS.cmps(tv(a, tile=True), 0.0, 5)
    relu = CS.sels(smask, tv(a, tile=True), None, 0.0)
    assert relu.dtype == D.FP16 and torch.equal(relu.data, torch.where(a >= 0, a, torch.zeros_like(a)))



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_shape, offset", [((6, 1), 0), ((6, 1), 1), ((6, 8), 0), ((1,), 0), ((8,), 0)])
def test_sels_of_a_half_value_selects_in_its_storage_as_the_fp32_path_would(dtype, mask_shape, offset):
    """A 2-byte float `sels` with a number selects in storage (on 4-byte words where the mask is one per row)
    with the result of the FP32 compute path: the number rounds to FP32, then to the dtype; inf stays inf; the
    box is kept. An odd storage offset (a row slice) takes the element path."""
    data = rand(7, 8, seed=30, dtype=torch.float32).to(dtype)[offset : offset + 6]
    data[0, 0], data[1, 1] = float("inf"), float("-inf")
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(31)) > 0.5
    for scalar in (0.0, -1.5, 3.14159, 7, 1e30, float("-inf")):
        got = CS.sels(tv(mask, tile=True), tv(data, valid=[6, 4], tile=True), None, scalar)
        want = torch.where(mask, data.float(), torch.tensor(scalar, dtype=torch.float32)).to(dtype)
        assert got.data.dtype == dtype and got.valid == (6, 4) and got.is_tile
        torch.testing.assert_close(got.data, want, rtol=0, atol=0)


def test_sel_of_one_dtype_moves_values_bit_for_bit():
    """A select moves values: a bf16 NaN's sign and payload survive (a round trip through FP32 canonicalises them),
    and the lhs keeps its valid box unless the mask or rhs broadcasts it."""
    odd_nan = torch.tensor([-0x3F, 0x7F81], dtype=torch.int16).view(torch.bfloat16)   # 0xFFC1, 0x7F81
    lhs = torch.cat([odd_nan, torch.tensor([1.5, -2.0], dtype=torch.bfloat16)]).view(1, 4)
    rhs = torch.zeros(1, 4, dtype=torch.bfloat16)
    mask = tv(torch.tensor([[1, 1, 0, 1]], dtype=torch.int64))
    picked = CS.sel(mask, tv(lhs, valid=(1, 3)), tv(rhs))
    assert picked.dtype == D.BF16 and picked.valid == (1, 3)
    assert torch.equal(picked.data.view(torch.int16), torch.where(mask.data != 0, lhs, rhs).view(torch.int16))
    rows = CS.sel(tv(torch.tensor([[1], [0]])), tv(lhs, valid=(1, 3)), tv(torch.zeros(2, 4, dtype=torch.bfloat16)))
    assert rows.valid is None and torch.equal(rows.data[0].view(torch.int16), lhs[0].view(torch.int16))

# --------------------------------------------------------------------------------------------- bitwise

def test_bitwise_and_shifts_keep_lhs_dtype():
    a = torch.tensor([[0b1100, -8, 7, 255]], dtype=torch.int32)
    b = torch.tensor([[0b1010, 3, 1, 15]], dtype=torch.int32)
    assert torch.equal(B.and_(tv(a), tv(b)).data, a & b)
    assert torch.equal(B.or_(tv(a), tv(b)).data, a | b)
    assert torch.equal(B.xor(tv(a), tv(b), None).data, a ^ b)
    assert torch.equal(B.shl(tv(a), tv(b)).data, a << b)
    assert torch.equal(B.shrs(tv(a), 2).data, a >> 2)  # arithmetic shift for signed
    out = B.ands(tv(a), 6)
    assert out.dtype == D.INT32 and torch.equal(out.data, a & 6)


def test_shift_wraps_to_lhs_width():
    a = torch.tensor([[0x40000000, 1]], dtype=torch.int32)
    assert B.shls(tv(a), 1).data.tolist() == [[-(1 << 31), 2]]


def test_not_is_int16_only_and_bitwise_rejects_mismatch():
    a = torch.tensor([[0, -1, 5]], dtype=torch.int16)
    assert torch.equal(B.not_(tv(a)).data, ~a)
    with pytest.raises(OpError, match="pl.not_"):
        B.not_(tv(torch.zeros(1, 2, dtype=torch.int32)))
    with pytest.raises(OpError, match="pl.and_"):
        B.and_(tv(torch.zeros(2, 4, dtype=torch.int32)), tv(torch.zeros(1, 4, dtype=torch.int32)))
    with pytest.raises(OpError, match="pl.shls"):
        B.shls(tv(torch.zeros(1, 2, dtype=torch.int16)), 16)
    with pytest.raises(OpError, match="pl.ors"):
        B.ors(tv(torch.zeros(1, 2, dtype=torch.float32)), 1)


# ---------------------------------------------------------------------------------------- scalar min/max

def test_pl_min_max_are_scalar_not_reductions():
    assert OPS["min"](16, 7) == 7 and OPS["max"](16, 7) == 16 and OPS["min"](2.5, 3) == 2.5
    with pytest.raises(OpError, match="pl.min"):
        OPS["min"](tv(torch.ones(2, 2)), 1)


def test_registered_names():
    for base in ("add", "sub", "mul", "div", "adds", "subs", "muls", "divs", "maximum", "minimum", "neg", "exp",
                 "log", "rsqrt", "recip", "cmp", "fmod", "fmods", "and_", "xors", "not_", "part_add"):
        assert base in OPS and f"tensor.{base}" in OPS and f"tile.{base}" in OPS, base
    for base in ("relu", "lrelu", "prelu", "rem", "rems", "sel", "sels", "cmps", "addc", "subsc", "maximums"):
        assert base in OPS and f"tile.{base}" in OPS, base
    assert "tensor.min" not in OPS and "tensor.max" not in OPS


def test_exp_flushes_subnormal_results_to_zero_and_is_torch_exp_elsewhere():
    x = torch.tensor([[-3.4e38, -1000.0, -100.0, -87.5, -87.2, -20.0, 0.0, 3.0, 80.0,
                       float("nan"), float("inf"), float("-inf")]])
    got = OPS["exp"](TensorValue(x, D.FP32)).data
    want = torch.exp(x)
    want[want < 1.1832e-38] = 0.0   # subnormal results (and the few just above FLT_MIN at the clamp) flush
    assert torch.equal(got[:, :9], want[:, :9]) and got[0, 4] > 0 and got[0, 3] == 0
    assert torch.isnan(got[0, 9]) and got[0, 10] == float("inf") and got[0, 11] == 0
    plain = torch.randn(4, 64) * 10   # no input below the clamp: exactly torch.exp
    assert torch.equal(OPS["exp"](TensorValue(plain, D.FP32)).data, torch.exp(plain))


def test_row_expand_expdif_flushes_like_exp():
    x = torch.tensor([[0.0, -200.0, -1.0]])
    got = OPS["row_expand_expdif"](TensorValue(x, D.FP32), TensorValue(torch.zeros(1, 1), D.FP32)).data
    assert torch.equal(got, torch.tensor([[1.0, 0.0, float(torch.exp(torch.tensor(-1.0)))]]))


def _torch_calls(fn):
    """The names of the torch calls `fn()` makes (a replay repeats each; attribute reads are not calls)."""
    from torch.overrides import TorchFunctionMode
    names = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") != "__get__":
                names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return names


@pytest.mark.parametrize("tile", [False, True])
def test_sel_over_a_compare_reuses_its_comparison(tile):
    """sel over a cmp / cmps result (numeric 0/1, or a tile's BOOL mask) selects with the comparison itself: no
    `!= 0` pass (a replay repeats each call); the same values as the `!= 0` form."""
    a, b = rand(4, 8, seed=30), rand(4, 8, seed=31)
    for mask in (CS.cmp(tv(a, tile=tile), tv(b, tile=tile), 4), CS.cmps(tv(a, tile=tile), 0.0, 5)):
        lhs, rhs = tv(a), tv(b)
        calls = _torch_calls(lambda: CS.sel(mask, lhs, rhs))
        assert calls == ["where"], calls
        want = torch.where(mask.data != 0, a, b)
        assert torch.equal(CS.sel(mask, tv(a), tv(b)).data, want)


def test_sel_over_a_compare_result_written_since_reads_the_written_values():
    a, b = rand(2, 4, seed=32), rand(2, 4, seed=33)
    mask = CS.cmp(tv(a), tv(b), 4)
    mask.data.fill_(1.0)      # written after the compare: its kept comparison no longer describes it
    assert torch.equal(CS.sel(mask, tv(a), tv(b)).data, a)
    view = CS.cmp(tv(a), tv(b), 4)
    view.data.view(-1)[0] = 1 - view.data.view(-1)[0]    # through a view (one version counter)
    assert torch.equal(CS.sel(view, tv(a), tv(b)).data, torch.where(view.data != 0, a, b))
