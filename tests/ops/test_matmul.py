"""matmul family: FP32/INT32 accumulation, exact int8, transposes, 1-D and batched shapes, zero padding
outside valid boxes, accumulator rules, tile forms, gemv, MX not supported."""
import pytest
import torch

from pypto_rt.errors import NotSupportedError, OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops import matmul as M
from pypto_rt.ops.dtype_rules import from_torch
from pypto_rt.ops.registry import OPS
from pypto_rt.ops.value import TensorValue

GEN = torch.Generator().manual_seed(0)


def tv(t, dtype=None, valid=None, tile=False):
    return TensorValue(t, dtype or from_torch(t.dtype), valid, tile)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def test_bf16_matmul_computes_in_fp32_and_defaults_to_fp32():
    a, b = randn(16, 64, dtype=torch.bfloat16), randn(64, 32, dtype=torch.bfloat16)
    out = M.matmul(tv(a), tv(b))
    assert out.dtype == D.FP32 and out.data.dtype == torch.float32 and out.valid is None
    assert torch.equal(out.data, a.float() @ b.float())
    cast = M.matmul(tv(a), tv(b), out_dtype=D.BF16)
    assert cast.dtype == D.BF16 and torch.equal(cast.data, (a.float() @ b.float()).bfloat16())


def test_int8_matmul_is_exact_without_overflow():
    a = torch.where(torch.rand(8, 512, generator=GEN) < 0.5, 127, -127).to(torch.int8)
    a[:, ::7] = -128
    b = torch.where(torch.rand(512, 16, generator=GEN) < 0.5, 127, -128).to(torch.int8)
    b[:, 0] = -128  # column 0 with a row of -128 reaches 512 * 16384: far beyond int8/int16
    ref = a.long() @ b.long()
    assert int(ref.abs().max()) > 2**20
    out = M.matmul(tv(a), tv(b))
    assert out.dtype == D.INT32 and out.data.dtype == torch.int32
    assert torch.equal(out.data.long(), ref)
    f = M.matmul(tv(a), tv(b), out_dtype=D.FP32)
    assert torch.equal(f.data, ref.float())


def test_b_trans_and_a_trans():
    a, w = randn(8, 32), randn(24, 32)  # w stored [N, K]
    out = M.matmul(tv(a), tv(w), b_trans=True)
    assert out.shape == (8, 24) and torch.allclose(out.data, a @ w.t(), atol=1e-5)
    at = randn(32, 8)  # lhs stored [K, M]
    out = M.matmul(tv(at), tv(w), a_trans=True, b_trans=True)
    assert out.shape == (8, 24) and torch.allclose(out.data, at.t() @ w.t(), atol=1e-5)


def test_batched_broadcast_shape_from_kernels():
    q, k = randn(16, 64), randn(1, 40, 64)
    out = M.matmul(tv(q), tv(k), b_trans=True)  # [16, K] @ [1, N, K]^T -> [1, 16, N]
    assert out.shape == (1, 16, 40)
    assert torch.allclose(out.data[0], q @ k[0].t(), atol=1e-5)
    b = M.matmul(tv(randn(3, 1, 4, 8)), tv(randn(5, 8, 2)))
    assert b.shape == (3, 5, 4, 2)
    with pytest.raises(OpError, match="do not broadcast"):
        M.matmul(tv(randn(3, 4, 8)), tv(randn(2, 8, 2)))


def test_vector_operands_and_dot():
    m, v = randn(6, 10), randn(10)
    assert torch.allclose(M.matmul(tv(m), tv(v)).data, m @ v, atol=1e-5)
    assert torch.allclose(M.matmul(tv(v), tv(m.t().contiguous())).data, v @ m.t(), atol=1e-5)
    dot = M.matmul(tv(v), tv(v))
    assert dot.shape == () and torch.allclose(dot.data, v @ v)
    with pytest.raises(OpError, match="no axes to transpose"):
        M.matmul(tv(v), tv(m), a_trans=True)


def test_operands_are_zero_padded_outside_valid_boxes():
    a, b = randn(8, 16), randn(16, 12)
    a_bad, b_bad = a.clone(), b.clone()
    a_bad[:, 10:] = float("nan")  # K beyond lhs valid K
    a_bad[6:, :] = float("inf")  # rows beyond lhs valid M
    b_bad[10:, :] = float("nan")
    out = M.matmul(tv(a_bad, valid=(6, 10)), tv(b_bad, valid=(10, 12)))
    assert out.valid is None and torch.isfinite(out.data).all()
    ref = torch.zeros(8, 12)
    ref[:6] = a[:6, :10] @ b[:10]
    assert torch.allclose(out.data, ref, atol=1e-5)
    garbage = torch.randint(-128, 127, (4, 8), generator=GEN).to(torch.int8)
    ones = torch.ones(8, 3, dtype=torch.int8)
    got = M.matmul(tv(garbage, valid=(4, 5)), tv(ones))
    assert torch.equal(got.data, garbage[:, :5].int().sum(1, keepdim=True).expand(4, 3))


def test_inner_dimension_mismatch_names_shapes():
    with pytest.raises(OpError, match=r"pl\.matmul: inner dimensions differ: lhs \[4, 8\].*rhs \[7, 3\]"):
        M.matmul(tv(randn(4, 8)), tv(randn(7, 3)))


def test_matmul_acc_accumulates_and_init_cond_overwrites():
    acc, a, b = randn(4, 6), randn(4, 8, dtype=torch.bfloat16), randn(8, 6, dtype=torch.bfloat16)
    out = M.matmul_acc(tv(acc), tv(a), tv(b))
    assert out.dtype == D.FP32 and torch.equal(out.data, acc + a.float() @ b.float())
    assert torch.equal(acc, acc.clone())  # new value; acc not mutated
    fresh = M.matmul_acc(tv(acc), tv(a), tv(b), init_cond=True)
    assert torch.equal(fresh.data, a.float() @ b.float())
    bt = M.matmul_acc(tv(acc), tv(a), tv(b.t().contiguous()), b_trans=True, init_cond=False)
    assert torch.equal(bt.data, out.data)
    i8 = torch.full((2, 256), 127, dtype=torch.int8)
    iacc = M.matmul_acc(tv(torch.ones(2, 2, dtype=torch.int32)), tv(i8), tv(i8.t().contiguous()))
    assert iacc.dtype == D.INT32 and iacc.data.tolist() == [[1 + 256 * 127 * 127] * 2] * 2


def test_matmul_acc_rejects_wrong_accumulator_dtype_or_shape():
    a, b = tv(randn(4, 8, dtype=torch.bfloat16)), tv(randn(8, 6, dtype=torch.bfloat16))
    with pytest.raises(OpError, match=r"pl\.matmul_acc: the accumulator must be pl\.FP32.*pl\.BF16 \[4, 6\]"):
        M.matmul_acc(tv(torch.zeros(4, 6, dtype=torch.bfloat16)), a, b)
    with pytest.raises(OpError, match="accumulator must be pl.INT32"):
        i8a, i8b = tv(torch.ones(4, 8, dtype=torch.int8)), tv(torch.ones(8, 6, dtype=torch.int8))
        M.matmul_acc(tv(torch.zeros(4, 6)), i8a, i8b)
    with pytest.raises(OpError, match=r"acc \[4, 5\] does not match"):
        M.matmul_acc(tv(torch.zeros(4, 5)), a, b)


def test_tile_forms():
    a, b = randn(4, 8, dtype=torch.float16), randn(8, 6, dtype=torch.float16)
    ref = a.float() @ b.float()
    out = M.tile_matmul(tv(a, tile=True), tv(b, tile=True))
    assert out.is_tile and out.dtype == D.FP32 and torch.equal(out.data, ref)
    acc = M.tile_matmul_acc(out, tv(a, tile=True), tv(b, tile=True))
    assert torch.equal(acc.data, 2 * ref)
    with pytest.raises(OpError, match="same dtype"):
        M.tile_matmul(tv(a), tv(b.float()))
    with pytest.raises(OpError, match="must be 2-D"):
        M.tile_matmul(tv(randn(2, 4, 8)), tv(randn(8, 6)))
    bias = randn(1, 6)
    assert torch.equal(M.matmul_bias(tv(a), tv(b), tv(bias)).data, ref + bias)
    with pytest.raises(OpError, match=r"bias must be \[1, 6\]"):
        M.matmul_bias(tv(a), tv(b), tv(randn(2, 6)))
    la, rb = randn(3, 4, 8), randn(3, 8, 5)
    bm = M.batch_matmul(tv(la), tv(rb))
    assert bm.shape == (3, 4, 5) and torch.allclose(bm.data, la @ rb, atol=1e-5)
    bma = M.batch_matmul_acc(bm, tv(la), tv(rb))
    assert torch.allclose(bma.data, 2 * (la @ rb), atol=1e-5)


def test_gemv_family():
    x, w = torch.randint(-127, 127, (1, 64), generator=GEN).to(torch.int8), torch.randint(
        -127, 127, (64, 16), generator=GEN).to(torch.int8)
    ref = x.long() @ w.long()
    g = M.gemv(tv(x), tv(w))
    assert g.dtype == D.INT32 and torch.equal(g.data.long(), ref)
    acc = M.gemv_acc(tv(torch.ones(1, 16, dtype=torch.int32)), tv(x), tv(w), acc_phase="partial")
    assert torch.equal(acc.data.long(), ref + 1)
    bias = torch.arange(16, dtype=torch.int32).reshape(1, 16)
    assert torch.equal(M.gemv_bias(tv(x), tv(w), tv(bias)).data.long(), ref + bias)
    h = M.gemv(tv(randn(1, 8, dtype=torch.bfloat16)), tv(randn(8, 4, dtype=torch.bfloat16)))
    assert h.dtype == D.FP32
    with pytest.raises(OpError, match=r"one row \[1, K\]"):
        M.gemv(tv(randn(2, 8)), tv(randn(8, 4)))
    with pytest.raises(OpError, match="acc_phase"):
        M.gemv(tv(randn(1, 8)), tv(randn(8, 4)), acc_phase="bogus")


def test_registered_names_and_mx_not_supported():
    for name in ("matmul", "tensor.matmul", "matmul_acc", "tensor.matmul_acc", "tile.matmul", "tile.matmul_acc",
                 "matmul_bias", "tile.matmul_bias", "batch_matmul", "tile.batch_matmul", "tile.batch_matmul_acc",
                 "gemv", "gemv_acc", "gemv_bias", "tile.gemv"):
        assert name in OPS
    with pytest.raises(NotSupportedError, match="pl.matmul_mx.*MX FP8"):
        OPS["matmul_mx"](None, None, None, None)
