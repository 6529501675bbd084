"""Views and writes: aliasing, valid boxes, padding, and what writes leave untouched."""
from __future__ import annotations

import math

import pytest
import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import AtomicType, PadValue
from pypto_rt.ops import access, create, views
from pypto_rt.ops.value import TensorValue


def tv(t, dtype=D.FP32, valid=None):
    return TensorValue(t, dtype, valid)


def test_reshape_aliases_so_writes_reach_the_source():
    cache = torch.zeros(4, 2, 8)
    flat = views.reshape(tv(cache), [8, 8])
    views.subscript_write(flat, (slice(5, 6), slice(None)), tv(torch.ones(1, 8)))
    assert torch.equal(cache[2, 1], torch.ones(8))
    assert cache.sum() == 8


def test_in_bounds_slice_is_a_view_and_overhang_is_a_padded_copy():
    src = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    inside = views.slice_(tv(src), [2, 3], [1, 2])
    assert inside.data.data_ptr() == src[1, 2:].data_ptr()
    over = views.slice_(tv(src), [4, 4], [2, 4])
    assert over.valid == (2, 2)
    assert torch.equal(over.data[:2, :2], src[2:, 4:])
    assert over.data[2:].abs().sum() == 0 and over.data[:, 2:].abs().sum() == 0


def test_slice_valid_shape_narrows_and_shifts_the_source_box():
    src = tv(torch.randn(8, 8), valid=(8, 5))
    s = views.slice_(src, [4, 4], [2, 3], valid_shape=[3, 4])
    assert s.valid == (3, 2)  # rows narrowed by valid_shape, cols clipped by the source box (5 - 3)


def test_fillpad_min_is_the_lowest_finite_value_not_minus_inf():
    x = tv(torch.randn(2, 4, dtype=torch.bfloat16), D.BF16, valid=(2, 3))
    out = views.fillpad(x, pad_value=PadValue.min)
    assert out.valid is None
    assert torch.all(out.data[:, 3] == torch.finfo(torch.bfloat16).min)
    assert not torch.isinf(out.data).any()
    assert torch.equal(out.data[:, :3], x.data[:, :3])
    assert torch.all(views.fillpad(x, pad_value=-math.inf).data[:, 3] == torch.finfo(torch.bfloat16).min)
    ints = views.fillpad(tv(torch.zeros(1, 4, dtype=torch.int32), D.INT32, valid=(1, 1)), PadValue.max)
    assert ints.data[0, 1] == 2**31 - 1


def test_assemble_of_a_partially_valid_tile_leaves_the_tail_untouched():
    target = torch.full((1, 8), -1, dtype=torch.int32)
    tile = tv(torch.arange(8, dtype=torch.int32).reshape(1, 8), D.INT32, valid=(1, 3))
    out = views.assemble(tv(target, D.INT32), tile, [0, 0])
    assert out.data is target
    assert target.tolist() == [[0, 1, 2, -1, -1, -1, -1, -1]]


def test_assemble_atomic_add_accumulates():
    target = torch.ones(2, 4)
    views.assemble(tv(target), tv(torch.full((1, 4), 2.0)), [1, 0], atomic=AtomicType.Add)
    assert target.tolist() == [[1.0] * 4, [3.0] * 4]


def test_assemble_squeezes_leading_unit_axes():
    target = torch.zeros(16, 8)
    views.assemble(tv(target), tv(torch.ones(1, 4, 8)), [4, 0])
    assert target[4:8].sum() == 32 and target.sum() == 32


def test_assemble_past_the_end_is_an_error():
    with pytest.raises(OpError, match="runs past the target"):
        views.assemble(tv(torch.zeros(4, 4)), tv(torch.ones(2, 2)), [3, 0])


def test_subscript_write_past_the_end_writes_the_valid_box_when_it_fits():
    # a [16, 4] tile whose valid rows are 3, written at row 5 of an 8-row tensor (the tail tile of a loop)
    target = torch.zeros(8, 4)
    tile = views.set_validshape(tv(torch.ones(16, 4)), 3, 4)
    views.subscript_write(tv(target), (slice(5, 21), slice(None)), tile)
    assert target[5:].sum() == 12 and target[:5].sum() == 0
    too_tall = views.set_validshape(tv(torch.ones(16, 4)), 4, 4)
    with pytest.raises(OpError, match="runs past the target"):
        views.subscript_write(tv(torch.zeros(8, 4)), (slice(5, 21), slice(None)), too_tall)


def test_subscript_rank_rules():
    x = tv(torch.arange(24, dtype=torch.float32).reshape(2, 3, 4))
    assert views.subscript_read(x, (1,)).shape == (3, 4)
    assert views.subscript_read(x, (1, slice(0, 2))).shape == (2, 4)
    assert views.subscript_read(x, (1, 2, 3)) == 23.0
    with pytest.raises(OpError, match="step"):
        views.subscript_read(x, (slice(0, 2, 2),))


def test_subscript_write_with_a_scalar_index_drops_that_axis_of_the_window():
    dst = torch.zeros(3, 4)
    views.subscript_write(tv(dst), (1, slice(None)), tv(torch.ones(1, 4)))
    assert dst[1].tolist() == [1.0] * 4 and dst.sum() == 4


def test_reshape_remaps_a_row_vector_valid_box():
    col = tv(torch.randn(8, 1), valid=(5, 1))
    row = views.reshape(col, [1, 8])
    assert row.valid == (1, 5)
    with pytest.raises(OpError, match="not a box"):
        views.reshape(tv(torch.randn(4, 4), valid=(2, 2)), [2, 8])


def test_set_validshape_shares_data_and_transpose_swaps_the_box():
    x = tv(torch.randn(4, 6))
    v = views.set_validshape(x, 2, 3)
    assert v.data is x.data and v.valid == (2, 3)
    assert views.transpose(v, 0, 1).valid == (3, 2)
    with pytest.raises(OpError, match="same axis"):
        views.transpose(x, 1, -1)


def test_reinterpret_view_is_bitwise():
    x = tv(torch.tensor([[1.0, -2.0]]))
    bits = views.reinterpret_view(x, D.INT32)
    assert bits.data.tolist() == [[0x3F800000, -0x40000000]]
    as_u32 = views.reinterpret_view(x, D.UINT32)
    assert as_u32.data.tolist() == [[0x3F800000, 0xC0000000]]


def test_read_write_and_arange():
    t = tv(torch.zeros(2, 3, dtype=torch.int32), D.INT32)
    access.write(t, [1, 2], 7)
    assert access.read(t, [1, 2]) == 7 and isinstance(access.read(t, [1, 2]), int)
    with pytest.raises(OpError, match="out of range"):
        access.read(t, [2, 0])
    r = create.arange(5, [1, 4], dtype=D.UINT32, descending=True)
    assert r.data.tolist() == [[5, 4, 3, 2]] and r.dtype == D.UINT32
    with pytest.raises(OpError, match="leading extents must be 1"):
        create.arange(0, [2, 4])


def test_load_zero_fills_outside_the_valid_box_and_store_writes_only_the_box():
    src = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    tile = create.load(tv(src), [2, 2], [4, 4])
    assert tile.valid == (2, 2) and tile.data[2:].abs().sum() == 0
    out = torch.full((4, 4), -1.0)
    create.store(tile, [0, 0], tv(out))
    assert torch.equal(out[:2, :2], src[2:, 2:]) and (out[2:] == -1).all() and (out[:, 2:] == -1).all()
