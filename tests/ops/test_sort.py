"""sort32 / mrgsort: block order, stability, index lanes, block_len units, format-2 merges, the top-k idiom."""
import pytest
import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import MaskPattern
from pypto_rt.ops import gather as G
from pypto_rt.ops import sort as S
from pypto_rt.ops.value import TensorValue


def tv(t, dtype, tile=False):
    return TensorValue(t, dtype, None, tile)


def ramp(n, start=0):
    """pl.arange(start, [1, n], dtype=pl.UINT32): UINT32 lives in int64 storage."""
    return tv(torch.arange(start, start + n, dtype=torch.int64).reshape(1, n), D.UINT32)


def split(pairs: TensorValue):
    """Values (even lanes) and the uint32 index bits (odd lanes) of a pair row, read as raw bits."""
    vals = pairs.data[:, 0::2]
    idx = pairs.data.view(torch.int32)[:, 1::2].to(torch.int64) & 0xFFFFFFFF
    return vals, idx


def tied_values(n, seed=0, levels=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, (1, n), generator=g).float() - 2.0


def stable_desc(x: torch.Tensor) -> torch.Tensor:
    return torch.argsort(-x, stable=True)


def sort_chain(x, block_lens):
    s = S.sort32(tv(x, D.FP32), ramp(x.shape[1]))
    for b in block_lens:
        s = S.mrgsort(s, block_len=b)
    return s


# ------------------------------------------------------------------------------------------ sort32
def test_sort32_each_block_descending_stable_with_index_lanes():
    x = tied_values(128)
    base = 1000
    out = S.sort32(tv(x, D.FP32), ramp(128, start=base))
    assert out.shape == (1, 256) and out.dtype == D.FP32
    vals, idx = split(out)
    for blk in range(4):
        seg = x[0, blk * 32:(blk + 1) * 32]
        order = stable_desc(seg)  # the goldens' "NPU sort32 deterministic order"
        assert torch.equal(vals[0, blk * 32:(blk + 1) * 32], seg[order])
        assert torch.equal(idx[0, blk * 32:(blk + 1) * 32], order + blk * 32 + base)


class _SortCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch.sort calls made inside it (each one is a replayed call of a recorded kernel)."""

    def __init__(self):
        super().__init__()
        self.sorts = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.sorts += func is torch.sort or func is torch.Tensor.sort
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows, n", [(1, 32), (32, 32), (1, 128), (3, 512)])
def test_sort32_is_one_torch_sort_per_call(rows, n):
    """The 32-element blocks sort as rows of their own, in one torch.sort: no second sort to order them by block."""
    x = torch.randint(0, 5, (rows, n), generator=torch.Generator().manual_seed(rows + n)).float()
    with _SortCalls() as counted:
        out = S.sort32(tv(x, D.FP32), tv(torch.arange(n).expand(rows, n).contiguous(), D.UINT32))
    assert counted.sorts == 1
    vals, idx = split(out)
    order = torch.sort(x.reshape(rows, n // 32, 32), dim=-1, descending=True, stable=True).indices
    order = (order + torch.arange(0, n, 32).unsqueeze(-1)).reshape(rows, n)
    assert torch.equal(vals, torch.gather(x, -1, order)) and torch.equal(idx, order)


def test_sort32_ties_keep_lower_position_first():
    x = torch.zeros(1, 32)
    x[0, [3, 7, 20]] = 5.0
    _, idx = split(S.sort32(tv(x, D.FP32), ramp(32)))
    assert idx[0, :3].tolist() == [3, 7, 20]
    assert idx[0, 3:].tolist() == [i for i in range(32) if i not in (3, 7, 20)]


def test_sort32_index_lanes_are_raw_bits_even_nan_patterns():
    x = torch.arange(32, dtype=torch.float32).reshape(1, 32)  # ascending -> fully reversed
    special = torch.tensor([0xFFFFFFFF, 0x7FC00001, 0x80000000, 0x7F800001] + list(range(28)), dtype=torch.int64)
    out = S.sort32(tv(x, D.FP32), tv(special.reshape(1, 32), D.UINT32))
    _, idx = split(out)
    assert torch.equal(idx[0], special.flip(0))


def test_sort32_rows_are_sorted_independently():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    idx = tv(torch.arange(64).repeat(3, 1), D.UINT32)
    vals, lanes = split(S.sort32(tv(x, D.FP32), idx))
    for r in range(3):
        for blk in range(2):
            seg = x[r, blk * 32:(blk + 1) * 32]
            assert torch.equal(lanes[r, blk * 32:(blk + 1) * 32], stable_desc(seg) + blk * 32)
            assert torch.equal(vals[r, blk * 32:(blk + 1) * 32], seg.sort(descending=True).values)


def test_sort32_fp16_pairs_carry_low_16_index_bits():
    x = torch.randn(1, 32).half()
    out = S.sort32(tv(x, D.FP16), ramp(32, start=0x10005))
    assert out.dtype == D.FP16 and out.shape == (1, 64)
    order = stable_desc(x[0].float())
    assert torch.equal(out.data[0, 0::2], x[0, order])
    assert torch.equal(out.data.view(torch.int16)[0, 1::2].long() & 0xFFFF, (order + 5) & 0xFFFF)


@pytest.mark.parametrize("src,idx,msg", [
    (tv(torch.zeros(1, 48), D.FP32), ramp(48), "multiple of 32"),
    (tv(torch.zeros(1, 32, dtype=torch.int32), D.INT32), ramp(32), "FP32 or pl.FP16"),
    (tv(torch.zeros(1, 32), D.FP32), tv(torch.zeros(1, 32), D.FP32), "integer index"),
    (tv(torch.zeros(1, 32), D.FP32), ramp(64), "src and idx"),
])
def test_sort32_errors(src, idx, msg):
    with pytest.raises(OpError, match=msg) as err:
        S.sort32(src, idx)
    assert "pl.sort32" in str(err.value)


# ----------------------------------------------------------------------------------------- mrgsort
def test_mrgsort_block_len_counts_pair_positions():
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(2))
    s = sort_chain(x, [])
    assert s.shape == (1, 512)  # 8 runs of 64 positions
    s = S.mrgsort(s, block_len=64)  # 4 runs of 64 -> 1 run of 256 positions (128 elements)
    vals, idx = split(s)
    for half in range(2):
        seg = x[0, half * 128:(half + 1) * 128]
        assert torch.equal(idx[0, half * 128:(half + 1) * 128], stable_desc(seg) + half * 128)
        assert torch.equal(vals[0, half * 128:(half + 1) * 128], seg[stable_desc(seg)])
    assert not torch.equal(vals[0], x[0][stable_desc(x[0])])  # two runs, not yet one
    vals, idx = split(S.mrgsort(s, block_len=256))  # a trailing partial group merges what it has
    assert torch.equal(idx[0], stable_desc(x[0]))
    assert torch.equal(vals[0], x[0][stable_desc(x[0])])


@pytest.mark.parametrize("n,chain", [(512, [64, 256]), (2048, [64, 256, 1024])])
def test_mrgsort_chains_sort_the_whole_row_stably(n, chain):
    x = tied_values(n, seed=n, levels=7)  # many ties across runs: merge must keep lower positions first
    vals, idx = split(sort_chain(x, chain))
    assert torch.equal(idx[0], stable_desc(x[0]))
    assert torch.equal(vals[0], x[0][stable_desc(x[0])])


def test_mrgsort_format2_merges_sorted_halves():
    x = tied_values(512, seed=3, levels=9)
    halves = [sort_chain(x[:, h * 256:(h + 1) * 256], [64, 256]) for h in range(2)]
    both = tv(torch.cat([h.data for h in halves], dim=1), D.FP32)
    merged = S.mrgsort(tv(both.data[:, 0:512], D.FP32), tv(both.data[:, 512:1024], D.FP32))
    assert merged.shape == (1, 1024)
    vals, idx = split(merged)
    # index lanes of the second half were 0..255 again: map them to global positions via the source
    assert torch.equal(vals[0], x[0][stable_desc(x[0])])
    order = stable_desc(x[0])
    assert torch.equal(idx[0], order % 256)


@pytest.mark.parametrize("ways", [3, 4])
def test_mrgsort_format2_multiway_ties_prefer_earlier_source(ways):
    x = tied_values(32 * ways, seed=ways, levels=3)
    parts = [S.sort32(tv(x[:, 32 * w:32 * (w + 1)], D.FP32), ramp(32, start=32 * w)) for w in range(ways)]
    tmp = tv(torch.zeros(1, 64 * ways), D.FP32, tile=True)
    merged = S.mrgsort(*parts, tmp) if ways == 4 else S.mrgsort(*parts, tmp=tmp)
    _, idx = split(merged)
    assert torch.equal(idx[0], stable_desc(x[0]))


def test_mrgsort_errors():
    s = sort_chain(torch.randn(1, 64), [])
    for bad in (0, 100, 32):
        with pytest.raises(OpError, match="multiple of 64"):
            S.mrgsort(s, block_len=bad)
    with pytest.raises(OpError, match="rows must be 1"):
        S.mrgsort(tv(torch.zeros(2, 128), D.FP32), block_len=64)
    with pytest.raises(OpError, match="format 2"):
        S.mrgsort(s)
    with pytest.raises(OpError, match="one dtype"):
        S.mrgsort(s, tv(torch.zeros(1, 64).half(), D.FP16))
    with pytest.raises(OpError, match="pl.mrgsort"):
        S.mrgsort(tv(torch.zeros(1, 64, dtype=torch.int32), D.INT32), block_len=64)


# ------------------------------------------------------------------------------------ top-k idiom
@pytest.mark.parametrize("k", [1, 8, 100])
def test_topk_idiom_matches_torch_topk(k):
    n = 512
    x = (torch.randperm(n, generator=torch.Generator().manual_seed(k)).float() - 200.0).reshape(1, n) / 8.0
    s = sort_chain(x, [64, 256])  # 1024 positions: 16 runs -> 4 runs -> 1 run
    pairs = tv(s.data[:, 0:2 * k], D.FP32)
    vals = G.gather(pairs, mask_pattern=MaskPattern.P0101)
    idx = G.gather(pairs, mask_pattern=MaskPattern.P1010, output_dtype=D.INT32)
    ref = torch.topk(x, k, dim=-1)
    assert vals.dtype == D.FP32 and idx.dtype == D.INT32 and idx.data.dtype == torch.int32
    assert torch.equal(vals.data, ref.values)
    assert torch.equal(idx.data.long(), ref.indices)  # distinct values: no ties


def test_topk_idiom_with_ties_values_exact_indices_stable():
    x = tied_values(512, seed=11, levels=6)
    s = sort_chain(x, [64, 256])
    pairs = tv(s.data[:, 0:32], D.FP32)
    vals = G.gather(pairs, mask_pattern=MaskPattern.P0101)
    idx = G.gather(pairs, mask_pattern=MaskPattern.P1010, output_dtype=D.UINT32)
    assert torch.equal(vals.data, torch.topk(x, 16).values)
    assert idx.data.dtype == torch.int64 and torch.equal(idx.data[0], stable_desc(x[0])[:16])
