"""Reductions honour the valid box (garbage outside must not leak); row/column broadcasts."""
import math

import pytest
import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops import reduce as R
from pypto_rt.ops.registry import OPS
from pypto_rt.ops.value import TensorValue


def tv(data, dtype=D.FP32, valid=None, tile=False):
    return TensorValue(torch.as_tensor(data), dtype, valid, tile)


def garbage_tile(rows=8, cols=16, vr=5, vc=11, seed=0):
    """A tile whose cells outside the valid box hold huge values, -huge values and NaNs."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[:, vc:] = 1e30
    x[:, vc::2] = math.nan
    x[vr:, :] = -1e30
    return x


@pytest.mark.parametrize("name, ref", [("row_sum", lambda v: v.sum(-1, keepdim=True)),
                                       ("row_max", lambda v: v.amax(-1, keepdim=True)),
                                       ("row_min", lambda v: v.amin(-1, keepdim=True)),
                                       ("row_prod", lambda v: v.prod(-1, keepdim=True))])
def test_row_reductions_mask_invalid_columns(name, ref):
    x = garbage_tile()
    out = OPS[name](tv(x, valid=(5, 11)))
    assert out.shape == (8, 1) and out.dtype == D.FP32
    assert out.valid == (5, 1)  # reduced axis fully valid (unit), rows keep their extent
    torch.testing.assert_close(out.data[:5], ref(x[:5, :11]))


@pytest.mark.parametrize("name, ref", [("col_sum", lambda v: v.sum(-2, keepdim=True)),
                                       ("col_max", lambda v: v.amax(-2, keepdim=True)),
                                       ("col_min", lambda v: v.amin(-2, keepdim=True)),
                                       ("col_prod", lambda v: v.prod(-2, keepdim=True))])
def test_col_reductions_mask_invalid_rows(name, ref):
    x = garbage_tile().T.contiguous()  # now rows 11.. and columns 5.. are garbage
    out = OPS[name](tv(x, valid=(11, 5)))
    assert out.shape == (1, 8) and out.valid == (1, 5)
    torch.testing.assert_close(out.data[:, :5], ref(x[:11, :5]))


def test_fully_valid_and_tmp_tile_ignored():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    tmp = tv(torch.zeros(4, 6), tile=True)
    out = OPS["tile.row_sum"](tv(x, tile=True), tmp)
    assert out.is_tile and out.valid is None
    torch.testing.assert_close(out.data, x.sum(-1, keepdim=True))
    torch.testing.assert_close(R.col_sum(tv(x), tmp).data, x.sum(0, keepdim=True))


def test_argmax_first_occurrence_over_valid_part():
    x = torch.tensor([[1.0, 5.0, 5.0, 2.0, 9.0],
                      [7.0, 7.0, 5.0, 7.0, 99.0],
                      [-1.0, -3.0, -3.0, -2.0, -50.0]])
    v = tv(x, valid=(3, 4))
    amax = R.row_argmax(v)
    assert amax.dtype == D.INT32 and amax.data.dtype == torch.int32 and amax.shape == (3, 1)
    assert amax.data.flatten().tolist() == [1, 0, 0]  # column 4 (garbage) must not win
    assert R.row_argmin(v).data.flatten().tolist() == [0, 2, 1]
    # rows 0-1 only (row 2, all smaller, is garbage); column 2 ties 5 vs 5 -> row 0 for both
    assert R.col_argmax(tv(x, valid=(2, 5))).data.flatten().tolist() == [1, 1, 0, 1, 1]
    assert R.col_argmin(tv(x, valid=(2, 5))).data.flatten().tolist() == [0, 0, 0, 0, 0]


def test_bf16_sum_accumulates_in_fp32_and_rounds_once():
    x = (torch.randn(16, 512, generator=torch.Generator().manual_seed(2)) * 10).to(torch.bfloat16)
    out = R.row_sum(tv(x, D.BF16))
    assert out.dtype == D.BF16
    torch.testing.assert_close(out.data, x.float().sum(-1, keepdim=True).to(torch.bfloat16), rtol=0, atol=0)


def test_int_reductions_keep_dtype():
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    x[:, 4:] = 1_000_000
    out = R.row_sum(tv(x, D.INT32, valid=(4, 4)))
    assert out.dtype == D.INT32 and out.data.flatten().tolist() == x[:, :4].sum(-1).tolist()
    assert R.row_max(tv(x, D.INT32, valid=(4, 4))).data.flatten().tolist() == x[:, 3].tolist()


def test_reduction_rank_errors():
    with pytest.raises(OpError, match="pl.col_sum"):
        R.col_sum(tv(torch.ones(4)))


# ----------------------------------------------------------------------------------------- broadcasts

@pytest.mark.parametrize("what, ref", [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                                       ("div", torch.div), ("max", torch.maximum), ("min", torch.minimum),
                                       ("expdif", lambda a, b: torch.exp(a - b))])
def test_row_and_col_expand_ops(what, ref):
    gen = torch.Generator().manual_seed(3)
    x, rv, cv = torch.randn(6, 10, generator=gen), torch.randn(6, 1, generator=gen), torch.randn(1, 10, generator=gen)
    row = OPS[f"row_expand_{what}"](tv(x, valid=(6, 7)), tv(rv))
    col = OPS[f"col_expand_{what}"](tv(x), tv(cv))
    torch.testing.assert_close(row.data, ref(x, rv.expand(6, 10)), rtol=0, atol=0)
    torch.testing.assert_close(col.data, ref(x, cv.expand(6, 10)), rtol=0, atol=0)
    assert row.valid == (6, 7) and col.valid is None  # x's box is kept


def test_expand_promotes_and_accepts_tmp():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    v = torch.randn(4, 1, generator=torch.Generator().manual_seed(5))
    out = OPS["tile.row_expand_add"](tv(x, D.BF16, tile=True), tv(v, tile=True), None)
    assert out.dtype == D.FP32 and out.is_tile
    torch.testing.assert_close(out.data, x.float() + v, rtol=0, atol=0)


def test_expand_bad_vector_shape():
    x = tv(torch.zeros(16, 64))
    with pytest.raises(OpError) as err:
        R.row_expand_mul(x, tv(torch.zeros(1, 16)))
    assert "pl.row_expand_mul" in str(err.value) and "[16, 64]" in str(err.value) and "[1, 16]" in str(err.value)
    with pytest.raises(OpError, match="pl.col_expand_mul"):
        R.col_expand_mul(x, tv(torch.zeros(16, 1)))


def test_row_expand_and_col_expand_broadcast_to_target():
    target = tv(torch.zeros(3, 5, dtype=torch.int32), D.INT32, valid=(3, 2))
    v = torch.tensor([[1.5], [2.5], [3.5]])
    out = R.row_expand(target, tv(v))
    assert out.dtype == D.FP32 and out.valid == (3, 2) and torch.equal(out.data, v.expand(3, 5))
    c = torch.arange(5, dtype=torch.int32).reshape(1, 5)
    out = R.col_expand(tv(torch.zeros(3, 5)), tv(c, D.INT32))
    assert out.dtype == D.FP32 and torch.equal(out.data, c.float().expand(3, 5))


def test_masked_softmax_chain_matches_torch_on_the_valid_part():
    x = garbage_tile(seed=6)
    t = tv(x, valid=(8, 11))
    shifted = R.row_expand_expdif(t, R.row_max(t))
    probs = R.row_expand_div(shifted, R.row_sum(shifted))
    torch.testing.assert_close(probs.data[:, :11], torch.softmax(x[:, :11], dim=-1))
    assert probs.valid == (8, 11)
