"""Byte regions: region_of boxes and the exact overlap test (checked against a byte-set oracle)."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from pypto_rt.aicpu import MemoryRegion, overlaps, region_of
from pypto_rt.aicpu.regions import MAX_RUNS, box_digits, digits_overlap


def _bytes(r: MemoryRegion) -> set[int]:
    out = set()
    for idx in itertools.product(*(range(n) for n in r.shape)):
        first = r.offset + sum(i * s for i, s in zip(idx, r.strides))
        out.update(range(first, first + r.itemsize))
    return out


def test_region_of_whole_view_and_clamped_box():
    x = torch.zeros(8, 16)
    whole = region_of(x)
    assert (whole.shape, whole.strides, whole.itemsize) == ((8, 16), (64, 4), 4)
    assert (whole.lo, whole.hi) == (whole.offset, whole.offset + 8 * 16 * 4)
    box = region_of(x, (6, None), (10, None))       # rows 6..15 clamped to 6..7
    assert box.shape == (2, 16) and box.offset == whole.offset + 6 * 64
    assert region_of(x, (9, 0), (1, 4)).shape == (0, 4)  # past the end: empty


def test_column_tiles_of_a_row_major_matrix_are_disjoint():
    x = torch.zeros(8, 16)
    left, right = region_of(x, (0, 0), (8, 4)), region_of(x, (0, 4), (8, 4))
    assert not overlaps(left, right)
    assert overlaps(left, region_of(x, (0, 0), (8, 4)))
    assert overlaps(left, region_of(x, (5, 3), (1, 2)))


def test_row_tiles_are_disjoint():
    x = torch.zeros(8, 16)
    assert not overlaps(region_of(x, (0, None), (4, None)), region_of(x, (4, None), (4, None)))
    assert overlaps(region_of(x, (0, None), (5, None)), region_of(x, (4, None), (4, None)))


def test_cache_vs_its_flat_reshape():
    cache = torch.zeros(16, 16, 64)
    flat = cache.view(256, 64)
    row37 = region_of(flat, (37, None), (1, None))
    assert overlaps(row37, region_of(cache, (2, 5, None), (1, 1, None)))
    assert not overlaps(row37, region_of(cache, (2, 6, None), (1, 1, None)))


def test_transposed_view():
    x = torch.zeros(8, 16)
    first_cols = region_of(x.t(), (0, None), (4, None))  # columns 0..3 of x
    assert overlaps(first_cols, region_of(x, (0, 0), (8, 4)))
    assert not overlaps(first_cols, region_of(x, (0, 4), (8, 4)))
    assert overlaps(first_cols, region_of(x, (3, None), (1, None)))


def test_int32_reinterpretation_of_float32_storage():
    x = torch.zeros(8, 16)
    as_int = x.view(torch.int32)
    assert overlaps(region_of(as_int, (2, 3), (1, 1)), region_of(x, (2, 3), (1, 1)))
    assert not overlaps(region_of(as_int, (2, 3), (1, 1)), region_of(x, (2, 4), (1, 1)))


def test_bf16_box_vs_the_same_bytes_as_int16_and_as_float32():
    y = torch.zeros(8, 16, dtype=torch.bfloat16)
    col5 = region_of(y, (0, 5), (8, 1))
    assert overlaps(col5, region_of(y.view(torch.int16), (0, 5), (8, 1)))
    assert not overlaps(col5, region_of(y.view(torch.int16), (0, 6), (8, 1)))
    wide = y.view(torch.float32)                       # float32 column 2 = bf16 columns 4 and 5
    assert overlaps(col5, region_of(wide, (0, 2), (8, 1)))
    assert not overlaps(region_of(y, (0, 6), (8, 1)), region_of(wide, (0, 2), (8, 1)))


def test_every_other_row_view():
    x = torch.zeros(8, 16)
    even, odd = region_of(x[::2]), region_of(x[1::2])
    assert not overlaps(even, odd)
    assert overlaps(even, region_of(x, (2, None), (1, None)))
    assert not overlaps(even, region_of(x, (3, None), (1, None)))


def test_interleaved_byte_columns():
    raw = torch.zeros(8, 16, dtype=torch.uint8)
    even, odd = region_of(raw[:, ::2]), region_of(raw[:, 1::2])
    assert not overlaps(even, odd)
    assert not digits_overlap(box_digits(even), box_digits(odd))
    assert overlaps(odd, region_of(raw, (3, 5), (1, 1)))


def test_other_storage_and_empty_boxes_never_overlap():
    x, z = torch.zeros(8, 16), torch.zeros(8, 16)
    assert not overlaps(region_of(x), region_of(z))
    assert not overlaps(region_of(x), region_of(x, (0, 0), (0, 16)))


def test_strides_that_do_not_divide_use_byte_runs():
    x = torch.zeros(15)
    a, b = region_of(x.view(3, 5), (0, 1), (3, 1)), region_of(x.view(5, 3))  # strides 20 vs 12
    assert overlaps(a, b)
    assert overlaps(a, region_of(x.view(5, 3), (2, 0), (1, 1)))               # element 6 = row 1 col 1
    assert not overlaps(a, region_of(x.view(5, 3), (0, 0), (1, 1)))


def test_too_many_runs_is_conservatively_an_overlap():
    n = MAX_RUNS + 1
    storage = torch.zeros(10 * n + 2, dtype=torch.uint8)
    evens = storage.as_strided((n,), (6,), 0)      # bytes 0, 6, 12, ...: all even
    odds = storage.as_strided((n,), (10,), 1)      # bytes 1, 11, 21, ...: all odd
    assert not overlaps(region_of(evens[:100]), region_of(odds[:100]))
    assert overlaps(region_of(evens), region_of(odds))


def test_random_boxes_match_a_byte_oracle():
    """overlaps (all three tiers) and the tensor map's per-entry digit test agree with the bytes shared."""
    rng = random.Random(7)
    base = torch.zeros(4 * 6 * 8)
    views = [base.view(4, 6, 8), base.view(24, 8), base.view(24, 8).t(), base.view(4, 6, 8)[:, ::2],
             base.view(torch.int16).view(4, 6, 16), base.view(24, 8)[1::3], base.view(torch.uint8).view(16, 48),
             base[3:38].view(5, 7), base.view(4, 6, 8).permute(2, 0, 1), base.as_strided((5, 7), (9, 2), 1),
             base.view(torch.uint8).view(16, 48)[:, ::2], base.view(torch.uint8).view(16, 48)[:, 1::2]]

    def box(view):
        offsets = [rng.randrange(n) for n in view.shape]
        return region_of(view, offsets, [rng.randrange(n - o + 1) for o, n in zip(offsets, view.shape)])

    same_layout = 0
    for _ in range(400):
        va = rng.choice(views)
        a, b = box(va), box(va if rng.random() < 0.5 else rng.choice(views))
        shared = bool(_bytes(a) & _bytes(b))
        assert overlaps(a, b) == shared and overlaps(b, a) == shared, (a, b)
        da, db = (box_digits(a), box_digits(b)) if a.lo < a.hi and b.lo < b.hi else (None, None)
        if da is not None and db is not None and da[0] == db[0]:
            assert digits_overlap(da, db) == shared, (a, b)
            same_layout += 1
    assert same_layout > 50


def test_region_is_frozen():
    r = region_of(torch.zeros(2))
    with pytest.raises(AttributeError):
        r.offset = 3


def test_a_shorter_box_spans_the_remaining_dims_whole():
    t = torch.zeros(8, 6)
    assert region_of(t, [2], [3]) == region_of(t, [2, None], [3, None]) == region_of(t, [2, 0], [3, 6])
