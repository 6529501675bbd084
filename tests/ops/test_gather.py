"""gather / scatter family: index, mask (bit reinterpretation) and compare forms, flat tile gather,
in-place scatters, gatherb, mgather, paged_gather."""
import pytest
import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import MaskPattern
from pypto_rt.ops import gather as G
from pypto_rt.ops import mgather as MG
from pypto_rt.ops import mscatter as M
from pypto_rt.ops.dtype_rules import from_torch
from pypto_rt.ops.value import TensorValue

GEN = torch.Generator().manual_seed(0)


def tv(t, dtype=None, valid=None, tile=False):
    return TensorValue(t, dtype or from_torch(t.dtype), valid, tile)


def randi(lo, hi, shape):
    return torch.randint(lo, hi, shape, generator=GEN, dtype=torch.int32)


# --------------------------------------------------------------------------------- index form
def test_index_gather_matches_torch_gather_with_k_larger_than_w():
    x = torch.randn(4, 8, generator=GEN)
    idx = randi(0, 8, (4, 20))  # K = 20 > W = 8
    out = G.gather(tv(x), dim=-1, index=tv(idx))
    assert out.shape == (4, 20) and out.dtype == D.FP32
    assert torch.equal(out.data, torch.gather(x, -1, idx.long()))


def test_index_gather_fewer_index_rows_and_tile_input_stays_per_row():
    x = torch.randn(4, 16, generator=GEN)
    idx = randi(0, 16, (2, 8))
    out = G.gather(tv(x, tile=True), dim=-1, index=tv(idx))
    assert out.is_tile and torch.equal(out.data, torch.gather(x[:2], -1, idx.long()))


def test_index_gather_ignores_garbage_outside_index_valid_box():
    x = torch.randn(2, 8, generator=GEN)
    idx = randi(0, 8, (2, 6))
    idx[:, 4:] = 1_000_000  # outside the valid box: never read
    out = G.gather(tv(x), dim=-1, index=tv(idx, valid=(2, 4)))
    assert out.valid == (2, 4)
    assert torch.equal(out.data[:, :4], torch.gather(x, -1, idx[:, :4].long()))


def test_index_gather_out_of_range_is_an_op_error():
    with pytest.raises(OpError, match=r"pl\.gather: index 9 is outside axis 1 of the input \[2, 8\]"):
        G.gather(tv(torch.zeros(2, 8)), dim=-1, index=tv(torch.full((2, 3), 9, dtype=torch.int32)))


def test_gather_forms_are_mutually_exclusive():
    x = tv(torch.zeros(2, 8))
    with pytest.raises(OpError, match="exactly one form"):
        G.gather(x, dim=-1, index=tv(torch.zeros(2, 2, dtype=torch.int32)), mask_pattern=MaskPattern.P0101)
    with pytest.raises(OpError, match="exactly one form"):
        G.gather(x)
    with pytest.raises(OpError, match="integer"):
        G.gather(x, dim=-1, index=tv(torch.zeros(2, 2)))


# ---------------------------------------------------------------------------------- mask form
@pytest.mark.parametrize("pattern,first,step", [
    (MaskPattern.P0101, 0, 2), (MaskPattern.P1010, 1, 2), (MaskPattern.P0001, 0, 4), (MaskPattern.P0010, 1, 4),
    (MaskPattern.P0100, 2, 4), (MaskPattern.P1000, 3, 4), (MaskPattern.P1111, 0, 1)])
def test_mask_gather_selects_pattern_columns(pattern, first, step):
    x = torch.arange(3 * 16, dtype=torch.float32).reshape(3, 16)
    out = G.gather(tv(x), mask_pattern=pattern)
    assert torch.equal(out.data, x[:, first::step])
    assert out.valid is None
    boxed = G.gather(tv(x, valid=(2, 7)), mask_pattern=int(pattern))
    assert boxed.valid_shape == (2, len(range(first, 7, step)))


def test_mask_gather_output_dtype_reinterprets_bits_not_values():
    x = torch.randn(2, 16, generator=GEN) * 1000
    raw = x.view(torch.int32)
    out = G.gather(tv(x), mask_pattern=MaskPattern.P1010, output_dtype=D.INT32)
    assert out.dtype == D.INT32 and torch.equal(out.data, raw[:, 1::2])
    assert not torch.equal(out.data, x[:, 1::2].to(torch.int32))  # a numeric cast would differ
    u = G.gather(tv(x), mask_pattern=MaskPattern.P0101, output_dtype=D.UINT32)
    assert u.data.dtype == torch.int64 and torch.equal(u.data, raw[:, 0::2].long() & 0xFFFFFFFF)
    assert int(u.data.min()) >= 0


def test_mask_gather_same_dtype_keeps_nan_payloads():
    bits = torch.tensor([[0x7FC00001, 0x7F800001, -1, 0x00000001]], dtype=torch.int32)
    out = G.gather(tv(bits.view(torch.float32)), mask_pattern=MaskPattern.P1111)
    assert torch.equal(out.data.view(torch.int32), bits)
    back = G.gather(tv(bits.view(torch.float32)), mask_pattern=MaskPattern.P1111, output_dtype=D.INT32)
    assert torch.equal(back.data, bits)


def test_mask_gather_reinterpretation_needs_same_byte_width():
    with pytest.raises(OpError, match="same byte width"):
        G.gather(tv(torch.zeros(1, 8)), mask_pattern=MaskPattern.P0101, output_dtype=D.INT16)
    with pytest.raises(OpError, match="mask_pattern must be"):
        G.gather(tv(torch.zeros(1, 8)), mask_pattern=9)


# ------------------------------------------------------------------------------- compare form
def test_compare_gather_eq_and_gt_like_the_compiler_tests():
    src = torch.full((16, 64), 101, dtype=torch.int32)
    src[:, 0::8] = 100
    dst, cnt = G.gather(tv(src), kvalue=100, cmp_mode="eq", out_cols=8)
    assert dst.dtype == D.INT32 and dst.shape == (16, 8)
    assert torch.equal(dst.data, torch.arange(0, 64, 8, dtype=torch.int32).expand(16, 8))
    assert cnt.shape == (1, 16) and torch.equal(cnt.data, torch.full((1, 16), 8, dtype=torch.int32))
    half = torch.zeros(16, 64, dtype=torch.float16)
    half[:, 56:] = 100
    dst, cnt = G.gather(tv(half), kvalue=50.0, cmp_mode=4, out_cols=8)  # 4 = gt
    assert torch.equal(dst.data, torch.arange(56, 64, dtype=torch.int32).expand(16, 8))


def test_compare_gather_offset_truncation_counts_and_count_dtype():
    x = torch.tensor([[1.0, 5.0, 7.0, 0.0, 9.0], [0.0, 0.0, 0.0, 0.0, 6.0]])
    dst, cnt = G.tile_gather_compare(tv(x), 5.0, None, cmp_mode="ge", offset=10, out_cols=2,
                                     count_dtype=D.UINT32)
    assert dst.data.tolist() == [[11, 12], [14, 0]]
    assert cnt.dtype == D.UINT32 and cnt.data.tolist() == [[3, 1]]
    with pytest.raises(OpError, match="cmp_mode"):
        G.gather(tv(x), kvalue=1.0, cmp_mode="bogus", out_cols=2)


def test_compare_gather_matches_a_per_row_scan_at_any_width_and_valid_box():
    """Every row's matching columns in order, then zeros, whether out_cols cuts them, equals the width or runs past
    it (the MoE live sums ask for more columns than the row has); columns outside the valid box never match."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(0, 4, (9, 13), generator=gen).to(torch.int32)
    x[3] = 3     # a row that matches everywhere
    x[4] = 0     # and one that matches nowhere
    for out_cols, valid in ((4, None), (13, None), (20, None), (20, (9, 6))):
        dst, cnt = G.gather(TensorValue(x, D.INT32, valid), kvalue=2, cmp_mode="ge", out_cols=out_cols)
        width = 13 if valid is None else valid[1]
        for r in range(9):
            found = [c for c in range(width) if x[r, c] >= 2]
            assert dst.data[r].tolist() == (found + [0] * out_cols)[:out_cols], (out_cols, valid, r)
            assert cnt.data[0, r] == len(found)
        assert dst.data.is_contiguous() and dst.shape == (9, out_cols)


# ------------------------------------------------------------------------------ tile gather
def test_tile_gather_uses_flat_indices():
    src = torch.randn(4, 16, generator=GEN)
    idx = randi(0, 64, (4, 8))
    out = G.tile_gather(tv(src, tile=True), tv(idx, tile=True), tv(torch.zeros(4, 8, dtype=torch.int32)))
    assert out.is_tile and torch.equal(out.data, src.flatten()[idx.long()])
    assert not torch.equal(out.data, torch.gather(src, -1, (idx % 16).long()))


def test_tile_gather_with_mask_pattern_is_the_mask_form():
    x = torch.randn(2, 8, generator=GEN)
    out = G.tile_gather(tv(x, tile=True), mask_pattern=MaskPattern.P1010, output_dtype=D.INT32)
    assert torch.equal(out.data, x.view(torch.int32)[:, 1::2])


# ----------------------------------------------------------------------------------- scatter
def test_mask_scatter_writes_in_place_and_inverts_mask_gather():
    x = torch.randn(3, 16, generator=GEN)
    even = G.gather(tv(x), mask_pattern=MaskPattern.P0101)
    odd = G.gather(tv(x), mask_pattern=MaskPattern.P1010)
    buf = tv(torch.zeros(3, 16))
    ret = G.scatter(even, mask_pattern=MaskPattern.P0101, dst=buf)
    assert ret is buf
    ret = G.scatter(odd, mask_pattern=MaskPattern.P1010, dst=buf)
    assert torch.equal(buf.data, x)
    with pytest.raises(OpError, match=r"does not fit"):
        G.scatter(tv(torch.zeros(3, 5)), mask_pattern=MaskPattern.P0101, dst=buf)


def test_index_scatter_returns_a_copy_last_write_wins():
    x = torch.zeros(2, 6)
    idx = torch.tensor([[1, 3, 1], [5, 0, 2]], dtype=torch.int32)
    s = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    out = G.scatter(tv(x), dim=-1, index=tv(idx), src=tv(s))
    ref = x.clone()
    for b in range(2):
        for k in range(3):
            ref[b, idx[b, k]] = s[b, k]
    assert torch.equal(out.data, ref) and out.data[0, 1] == 3.0
    assert torch.equal(x, torch.zeros(2, 6))  # input untouched
    with pytest.raises(OpError, match="exactly one form"):
        G.scatter(tv(x), dim=-1, index=tv(idx), src=tv(s), mask_pattern=MaskPattern.P0101)


def test_tile_scatter_and_mscatter_flat_in_place():
    out = tv(torch.zeros(4, 4))
    src = torch.arange(1, 7, dtype=torch.float32).reshape(2, 3)
    idx = torch.tensor([[15, 0, 5], [9, 5, 2]], dtype=torch.int32)
    assert M.mscatter(tv(src), tv(idx), out) is out
    ref = torch.zeros(16)
    for i in range(2):
        for j in range(3):
            ref[idx[i, j]] = src[i, j]
    assert torch.equal(out.data.flatten(), ref)
    dst = tv(torch.zeros(4, 4))
    assert G.tile_scatter(dst, tv(src), tv(idx)) is dst and torch.equal(dst.data, out.data)
    boxed = tv(torch.zeros(4, 4))
    M.mscatter(tv(src, valid=(1, 3)), tv(idx), boxed)  # only src's valid box is written
    assert boxed.data.flatten()[[15, 0, 5, 9, 2]].tolist() == [1.0, 2.0, 3.0, 0.0, 0.0]


def test_mscatter_row_coalesce_writes_whole_rows_at_a_row_or_column_index():
    src = torch.randn(3, 4, generator=GEN)
    for idx in (torch.tensor([[5, 0, 2]], dtype=torch.int32), torch.tensor([[5], [0], [2]], dtype=torch.int32)):
        out = tv(torch.zeros(6, 4))
        assert M.mscatter(tv(src), tv(idx), out, "row") is out
        assert torch.equal(out.data[[5, 0, 2]], src) and not out.data[[1, 3, 4]].any()
    boxed = tv(torch.zeros(6, 4))
    M.mscatter(tv(src, valid=(2, 4)), tv(torch.tensor([[5, 0, 2]], dtype=torch.int32)), boxed, coalesce=0)
    assert torch.equal(boxed.data[[5, 0]], src[:2]) and not boxed.data[2].any()   # src's valid rows only
    with pytest.raises(OpError, match="coalesce='row' needs"):
        M.mscatter(tv(src), tv(torch.tensor([[1, 2, 3]], dtype=torch.int32)), tv(torch.zeros(6, 5)), "row")


def test_mscatter_skip_drops_every_index_past_the_target_read_as_uint32():
    src = torch.randn(4, 3, generator=GEN)
    for dtype in (torch.int32, torch.int64):
        before = torch.randn(8, 3, generator=GEN)
        out = tv(before.clone())
        M.mscatter(tv(src), tv(torch.tensor([[6, -1, 0, 8]], dtype=dtype)), out, "row", scatter_oob="skip")
        want = before.clone()
        want[6], want[0] = src[0], src[2]
        assert torch.equal(out.data, want)      # -1 reaches neither the last row (pitfall 1) nor any other
    before = torch.randn(2, 4, generator=GEN)
    flat = tv(before.clone())         # coalesce="elem": element 0 is the spare the skipped writes rewrite
    M.mscatter(tv(torch.tensor([1.0, 2.0, 3.0])), tv(torch.tensor([7, -2, 9])), flat, scatter_oob=1)
    assert torch.equal(flat.data.flatten(), torch.cat([before.flatten()[:7], torch.tensor([1.0])]))


def test_mscatter_skip_leaves_the_spare_row_its_own_value_and_a_small_target_all_kept_rows():
    src = torch.randn(3, 2, generator=GEN)
    before = torch.randn(5, 2, generator=GEN)
    out = tv(before.clone())          # rows 0 and 2 written: row 1 is the spare the skipped write rewrites
    M.mscatter(tv(src), tv(torch.tensor([[0, -1, 2]])), out, "row", scatter_oob="skip", scatter_conflict="default")
    assert torch.equal(out.data[1], before[1]) and torch.equal(out.data[[0, 2]], src[[0, 2]])
    small = tv(before[:2].clone())    # no room for a spare (2 rows, 3 writes): only the kept rows are written
    M.mscatter(tv(src), tv(torch.tensor([[1, -1, 0]])), small, "row", scatter_oob="skip")
    assert torch.equal(small.data, src[[2, 0]])
    empty = tv(before.clone())
    M.mscatter(tv(src), tv(torch.tensor([[-1, -1, -1]])), empty, "row", scatter_oob="skip")
    assert torch.equal(empty.data, before)


def test_mscatter_some_kept_redirects_skipped_rows_onto_a_kept_row_with_its_own_bits():
    """some_kept: a skipped row rewrites the kept row of the smallest target with that row's data: the same result
    as "skip" to the bit (NaN payloads too), no other row touched, and no spare row read or put back."""
    nan_bits = torch.tensor([0x7FC01234, 0x7FC05678], dtype=torch.int32).view(torch.float32)
    src = torch.cat([torch.randn(3, 2, generator=GEN), nan_bits[None]])
    before = torch.randn(7, 2, generator=GEN)
    for idx in ([[-1, 5, -1, 2]], [[4, -1, 6, 0]], [[3, 1, 0, 6]]):
        for dtype in (torch.int32, torch.int64):
            want, got = tv(before.clone()), tv(before.clone())
            M.mscatter(tv(src), tv(torch.tensor(idx, dtype=dtype)), want, "row", scatter_oob="skip")
            with _Calls() as calls:
                M.mscatter(tv(src), tv(torch.tensor(idx, dtype=dtype)), got, "row", scatter_oob="skip",
                           scatter_conflict="default", some_kept=True)
            assert torch.equal(got.data.view(torch.int32), want.data.view(torch.int32)), idx
            assert calls.names.count("index_copy_") == 1 and "scatter" not in calls.names, calls.names
    last = tv(before.clone())          # "last" with a repeated kept target: the later row, -1 rows included
    M.mscatter(tv(src), tv(torch.tensor([[2, -1, 2, 5]])), last, "row", scatter_oob="skip", some_kept=True)
    assert torch.equal(last.data[2], src[2]) and torch.equal(last.data[5].view(torch.int32), nan_bits.view(torch.int32))


def test_mscatter_some_kept_with_every_row_skipped_raises_and_writes_nothing():
    src, before = torch.randn(3, 2, generator=GEN), torch.randn(5, 2, generator=GEN)
    out = tv(before.clone())
    with pytest.raises(OpError, match="some_kept=True, but every index is skipped"):
        M.mscatter(tv(src), tv(torch.tensor([[-1, 7, -3]])), out, "row", scatter_oob="skip", some_kept=True)
    assert torch.equal(out.data, before)
    for kwargs in ({"scatter_oob": "clamp", "some_kept": True}, {"scatter_oob": "skip", "some_kept": 1}):
        with pytest.raises(OpError, match="some_kept must be a bool, and True only with"):
            M.mscatter(tv(src), tv(torch.tensor([[0, 1, 2]])), out, "row", **kwargs)


def test_mscatter_clamp_wrap_and_an_undefined_index_past_the_target():
    src = torch.tensor([[1.0], [2.0]])
    clamped, wrapped = tv(torch.zeros(4, 1)), tv(torch.zeros(4, 1))
    M.mscatter(tv(src), tv(torch.tensor([[9, 1]])), clamped, "row", scatter_oob="clamp")
    M.mscatter(tv(src), tv(torch.tensor([[6, 1]])), wrapped, "row", scatter_oob="wrap")
    assert clamped.data.flatten().tolist() == [0.0, 2.0, 0.0, 1.0] == wrapped.data[[0, 1, 3, 2]].flatten().tolist()
    with pytest.raises(OpError, match="index -1 is outside the 4 rows"):
        M.mscatter(tv(src), tv(torch.tensor([[-1, 1]])), tv(torch.zeros(4, 1)), "row")
    for arg, bad in (("coalesce", "col"), ("scatter_oob", "zero"), ("scatter_conflict", 2)):
        with pytest.raises(OpError, match=f"{arg} must be one of"):
            M.mscatter(tv(src), tv(torch.tensor([[0, 1]])), tv(torch.zeros(4, 1)), **{"coalesce": "row", arg: bad})


def test_mscatter_default_conflict_makes_no_last_write_pass():
    src = torch.randn(3, 4, generator=GEN)
    idx = tv(torch.tensor([[2, 4, 2]], dtype=torch.int32))
    with _Calls() as calls:
        last = tv(torch.zeros(6, 4))
        M.mscatter(tv(src), idx, last, "row")
    assert torch.equal(last.data[2], src[2]) and "searchsorted" in calls.names    # "last": the later row
    with _Calls() as calls:
        anyone = tv(torch.zeros(6, 4))
        M.mscatter(tv(src), idx, anyone, "row", scatter_conflict="default")
    assert "searchsorted" not in calls.names and "sort" not in calls.names, calls.names
    assert any(torch.equal(anyone.data[2], src[i]) for i in (0, 2)) and torch.equal(anyone.data[4], src[1])


def test_scatter_update_2d_and_paged_4d_in_place():
    cache = tv(torch.zeros(8, 4))
    src = torch.randn(4, 4, generator=GEN)
    index = torch.tensor([[6, 1], [6, 3]], dtype=torch.int32)
    assert G.scatter_update(cache, -2, tv(index), tv(src)) is cache
    assert torch.equal(cache.data[6], src[2]) and torch.equal(cache.data[1], src[1])
    assert torch.equal(cache.data[3], src[3]) and cache.data[0].abs().sum() == 0
    paged = tv(torch.zeros(3, 4, 1, 5))
    rows = torch.randn(2, 1, 1, 5, generator=GEN)
    G.scatter_update(paged, tv(torch.tensor([[9, 2]], dtype=torch.int32)), tv(rows.reshape(1, 2, 1, 5)), dim=-2)
    flat = paged.data.reshape(12, 5)
    assert torch.equal(flat[9], rows[0, 0, 0]) and torch.equal(flat[2], rows[1, 0, 0])
    with pytest.raises(OpError, match="outside"):
        G.scatter_update(cache, -2, tv(torch.tensor([[8]], dtype=torch.int32)), tv(torch.zeros(1, 4)))


class _Calls(torch.overrides.TorchFunctionMode):
    """Names of the torch functions called under it (the passes an op makes over its data)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_scatter_update_with_distinct_targets_writes_the_rows_without_resolving_duplicates():
    cache, src = torch.zeros(8, 4), torch.randn(3, 4, generator=GEN)
    with _Calls() as calls:
        G.scatter_update(tv(cache), 0, tv(torch.tensor([[5], [1], [6]], dtype=torch.int32)), tv(src))
    assert torch.equal(cache[[5, 1, 6]], src) and not cache[[0, 2, 3, 4, 7]].any()
    assert "searchsorted" not in calls.names, calls.names   # (no last-write pass: no two rows share a target)
    with _Calls() as calls:   # a repeated target still takes the last write
        G.scatter_update(tv(cache), 0, tv(torch.tensor([[2], [2]], dtype=torch.int32)), tv(src[:2]))
    assert torch.equal(cache[2], src[1]) and "searchsorted" in calls.names


def test_mgather_of_a_fully_valid_index_makes_no_masking_pass_over_the_rows():
    mem, idx = torch.randn(6, 4, generator=GEN), torch.tensor([[4, 0, 5]], dtype=torch.int32)
    with _Calls() as calls:
        out = MG.mgather(tv(mem), tv(idx, valid=(1, 3)), coalesce="row")   # a box covering the index
    assert torch.equal(out.data, mem[[4, 0, 5]]) and out.valid_shape == (3, 4)
    assert calls.names.count("where") == 0, calls.names   # the index needs no masking, the rows no zeroing pass
    oob = torch.tensor([[1], [9]], dtype=torch.int32)
    zero = MG.mgather(tv(mem), tv(oob), coalesce="row", gather_oob="zero")   # dropped rows are still zeroed
    assert torch.equal(zero.data, torch.stack([mem[1], torch.zeros(4)]))


def _with_nan_payloads(rows: int, width: int) -> torch.Tensor:
    """bf16 rows whose bits include NaN payloads, infinities, -0 and subnormals (a copy must keep every bit)."""
    bits = torch.randint(-2**15, 2**15, (rows, width), generator=GEN, dtype=torch.int16)
    bits[0, :4] = torch.tensor([0x7FC1, -0x7F, 0x7F80, 0x0001], dtype=torch.int16)   # NaN, -0-ish, inf, subnormal
    return bits.view(torch.bfloat16)


def test_bf16_row_gather_and_scatter_move_fp32_words_with_every_bit_kept():
    # torch's CPU index_select / index_copy_ copy float rows with vector moves and 2-byte rows element by element
    # (2-3x slower at prefill sizes): rows of 2-byte data with an even width move as FP32 words
    mem, idx = _with_nan_payloads(6, 8), torch.tensor([[4], [0], [5], [0]], dtype=torch.int32)
    with _Calls() as calls:
        out = MG.mgather(tv(mem), tv(idx), coalesce="row")
    assert out.data.dtype == torch.bfloat16 and torch.equal(out.data.view(torch.int16), mem[[4, 0, 5, 0]].view(torch.int16))
    assert "view" in calls.names, calls.names
    cache, src = torch.zeros(8, 8, dtype=torch.bfloat16), _with_nan_payloads(3, 8)
    with _Calls() as calls:
        G.scatter_update(tv(cache), 0, tv(torch.tensor([[5], [1], [5]], dtype=torch.int32)), tv(src))
    assert torch.equal(cache[[5, 1]].view(torch.int16), src[[2, 1]].view(torch.int16)) and "index_copy_" in calls.names
    assert calls.names.count("index_select") == 1, calls.names   # the last write's rows too (target 5 twice)
    odd = _with_nan_payloads(3, 5)   # an odd width keeps the element copy
    assert torch.equal(MG.mgather(tv(odd), tv(torch.tensor([[2], [0]], dtype=torch.int32)), coalesce="row").data
                       .view(torch.int16), odd[[2, 0]].view(torch.int16))


# ------------------------------------------------------------------------ gatherb / mgather / paged
def test_gatherb_copies_32_byte_blocks():
    src = torch.arange(64, dtype=torch.float32).reshape(1, 64)  # 8 blocks of 8 floats
    offs = torch.tensor([[224, 0], [32, 96]], dtype=torch.int64)
    out = G.gatherb(tv(src, tile=True), tv(offs, D.UINT32))
    assert out.shape == (2, 16)
    assert out.data[0].tolist() == list(range(56, 64)) + list(range(0, 8))
    ints = G.gatherb(tv(src), tv(offs, D.UINT32, valid=(1, 2)), output_dtype=D.INT32)
    assert ints.valid == (1, 16) and torch.equal(ints.data[0], src.view(torch.int32)[0, [*range(56, 64), *range(8)]])


def test_mgather_row_and_elem_with_oob_modes():
    mem = torch.arange(40, dtype=torch.float32).reshape(8, 5)
    idx = torch.tensor([[7, 0, 3, 2]], dtype=torch.int32)
    out = MG.mgather(tv(mem), tv(idx, valid=(1, 3)), coalesce="row")
    assert out.shape == (4, 5) and out.valid == (3, 5)
    assert torch.equal(out.data[:3], mem[[7, 0, 3]]) and out.data[3].abs().sum() == 0
    oob = torch.tensor([[-1, 41], [3, 40]], dtype=torch.int32)
    z = MG.mgather(tv(mem), tv(oob), coalesce="elem", gather_oob="zero")
    assert z.data.tolist() == [[0.0, 0.0], [3.0, 0.0]]
    w = MG.mgather(tv(mem), tv(oob), coalesce=1, gather_oob="wrap")
    assert w.data.tolist() == [[float((2**32 - 1) % 40), 1.0], [3.0, 0.0]]
    with pytest.raises(OpError, match="outside"):
        MG.mgather(tv(mem), tv(oob), coalesce="elem")


def test_paged_gather_translates_through_the_block_table():
    pool = torch.randn(16, 6, generator=GEN)
    table = torch.tensor([3, 1, 0, 2], dtype=torch.int32)
    idx = torch.tensor([0, 5, 9, 14], dtype=torch.int32)
    out = MG.paged_gather(tv(pool), tv(idx), tv(table), 4, 4, 6, col_off=1)
    phys = [int(table[i // 4]) * 4 + int(i) % 4 for i in idx]
    assert out.shape == (6, 4) and out.valid == (4, 4)
    assert torch.equal(out.data[:4], pool[phys, 1:5]) and out.data[4:].abs().sum() == 0
    t = MG.paged_gather(tv(pool), tv(idx.reshape(1, 4)), tv(table), 4, 4, 6, col_off=1, is_trans=True)
    assert t.shape == (4, 6) and torch.equal(t.data, out.data.t())


# ------------------------------------------ recorded checks and duplicate resolution: fewer replayed calls (issue 14)

def _recorded_scatter_update(make_index, rows: int = 6, n: int = 4):
    """scatter_update(dst, 0, index, src) recorded with dst, src and `base` (an int32 [n] tensor) as entry tensors;
    `make_index(base)` makes the index inside the run. Returns (replay source, replay function)."""
    from pypto_rt.replay.capture import Recorder
    from pypto_rt.replay.passes import compile_trace

    dst, src, base = torch.zeros(rows, 3), torch.randn(n, 3), torch.tensor([1, 3, 1, 0], dtype=torch.int32)
    with Recorder([dst, src, base]) as rec:
        G.scatter_update(tv(dst), 0, tv(make_index(base), D.INT32), tv(src))
    assert rec.refused is None, rec.refused
    source = rec.source([rec.name_of(dst)])
    return source, compile_trace(source, rec.constants)


def _eager_scatter_update(dst, index, src):
    return G.scatter_update(tv(dst.clone()), 0, tv(index, D.INT32), tv(src)).data


def test_a_scatter_index_from_data_is_checked_in_one_clamp_and_resolved_every_replay():
    source, replay = _recorded_scatter_update(lambda base: base)
    assert source.count("assertasync_") == 1 and "clamp_" in source and "ge_" not in source, source
    for index in ([2, 2, 5, 2], [0, 1, 2, 3]):      # duplicates: the last write wins, as eagerly
        dst, src, base = torch.zeros(6, 3), torch.randn(4, 3), torch.tensor(index, dtype=torch.int32)
        want = _eager_scatter_update(dst, base, src)
        assert torch.equal(replay(dst, src, base)[0], want)
    for bad in ([0, 6, 1, 2], [0, -1, 1, 2]):
        with pytest.raises(RuntimeError, match=r"pl.scatter_update: an index is outside the 6 rows"):
            replay(torch.zeros(6, 3), torch.randn(4, 3), torch.tensor(bad, dtype=torch.int32))


def test_a_scatter_index_from_constants_is_checked_and_resolved_once_when_recording():
    """An arange-derived index is the same in every replay: neither its bounds check nor the last-write-wins
    sort is replayed; a fixed index with duplicates replays only the pick of the winning rows."""
    distinct, replay = _recorded_scatter_update(lambda base: torch.arange(3, -1, -1, dtype=torch.int32))
    assert "assertasync_" not in distinct and "sort_" not in distinct, distinct
    dst, src = torch.zeros(6, 3), torch.randn(4, 3)
    assert torch.equal(replay(dst, src, torch.zeros(4, dtype=torch.int32))[0],
                       _eager_scatter_update(torch.zeros(6, 3), torch.arange(3, -1, -1, dtype=torch.int32), src))
    repeated, replay = _recorded_scatter_update(lambda base: torch.arange(4, dtype=torch.int32) // 2)
    assert "sort_" not in repeated and "searchsorted_" not in repeated, repeated
    dst, src = torch.zeros(6, 3), torch.randn(4, 3)
    want = _eager_scatter_update(torch.zeros(6, 3), torch.tensor([0, 0, 1, 1], dtype=torch.int32), src)
    assert torch.equal(replay(dst, src, torch.zeros(4, dtype=torch.int32))[0], want)
    assert torch.equal(want[:2], src[[1, 3]])


def test_a_fixed_index_outside_the_rows_raises_the_op_error_when_recording():
    with pytest.raises(OpError, match=r"pl.scatter_update: index 6 is outside the 6 rows"):
        _recorded_scatter_update(lambda base: torch.arange(4, dtype=torch.int32) + 6)


def test_an_mgather_index_read_as_uint32_is_checked_with_one_compare():
    from pypto_rt.replay.capture import Recorder
    from pypto_rt.replay.passes import compile_trace

    mem, idx = torch.randn(5, 3), torch.tensor([[4], [0], [2]], dtype=torch.int32)
    with Recorder([mem, idx]) as rec:
        out = MG.mgather(tv(mem), tv(idx, D.INT32), coalesce="row")
    source = rec.source([rec.name_of(out.data)])
    assert "assertasync_" in source and "ge_" not in source and "clamp_" not in source, source
    replay = compile_trace(source, rec.constants)
    assert torch.equal(replay(mem, idx)[0], mem[[4, 0, 2]])
    with pytest.raises(RuntimeError, match=r"pl.mgather: an index is outside the 5 gatherable entries"):
        replay(mem, torch.tensor([[4], [-1], [2]], dtype=torch.int32))   # -1 read as uint32
