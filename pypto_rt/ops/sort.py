"""Sorting for top-k: `pl.sort32` and `pl.mrgsort` on "sorted pair rows". A pair row of N elements has
2N positions of the value dtype: position 2j holds the value, position 2j+1 the bit pattern of the index
carried with it (FP32 rows: the uint32 index bits in an FP32 slot; FP16 rows, an assumption since no
kernel uses them: the low 16 bits of the index in an FP16 slot). Index lanes are only ever moved as raw
integers through `.view(int32/int16)`, never touched by float math, so any bit pattern (even a NaN one)
survives. sort32 sorts each 32-element block descending; mrgsort format 1 (`block_len=B`, B positions =
B/2 elements per input run) merges every group of four adjacent runs (a trailing partial group merges
what it has); format 2 merges 2-4 separately sorted rows into one of the summed width. Both are a stable
descending sort of the values carrying the index lanes, which equals a stable merge of sorted inputs
with ties resolved toward the earlier run/source: ties keep their lower original position first.
sort32 accepts several rows (each row sorted independently, as the hardware does); mrgsort requires one
row (an ISA constraint: loop rows with pl.range).
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops import index_range, pair_lanes, recording
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue

_LANE = {D.FP32: torch.int32, D.FP16: torch.int16}  # raw integer view of one position


def _shape(v) -> list[int]:
    return list(v.shape)


def _check_pairs(name: str, v) -> None:
    if not isinstance(v, TensorValue):
        raise OpError(f"pl.{name}: expected a sorted pair row (tensor or tile), got {type(v).__name__}")
    if v.dtype not in _LANE:
        raise OpError(f"pl.{name}: sorted pair rows must be pl.FP32 or pl.FP16, got {v.dtype!r} {_shape(v)}")
    if v.ndim != 2 or v.shape[0] != 1 or v.shape[1] % 2:
        raise OpError(f"pl.{name}: needs one pair row [1, 2N] (rows must be 1; loop rows with pl.range), "
                      f"got {_shape(v)}")


def _index_bits(idx: torch.Tensor, lane: torch.dtype) -> torch.Tensor:
    """The low bits of integer indices as a signed integer tensor of the lane width (two's complement wrap)."""
    bits = 8 * torch.empty((), dtype=lane).element_size()
    low = idx.to(torch.int64) & ((1 << bits) - 1)
    return torch.where(low >= (1 << (bits - 1)), low - (1 << bits), low).to(lane)


def _sorted_order(keys: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Permutation ordering by (group ascending, key descending), ties by original position."""
    by_key = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    by_group = torch.sort(torch.gather(group, -1, by_key), dim=-1, stable=True).indices
    return torch.gather(by_key, -1, by_group)


def _permute_pairs(raw: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Reorder the (value, index) pairs of raw pair rows [rows, 2N] by an element order [rows, N]."""
    rows, width = raw.shape
    pairs = raw.reshape(rows, width // 2, 2)
    return torch.gather(pairs, 1, order.unsqueeze(-1).expand(rows, width // 2, 2)).reshape(rows, width)


def _sort_groups(v: TensorValue, group_elems: int) -> torch.Tensor:
    """Raw pair row of v with every group of `group_elems` elements sorted descending (stable)."""
    lane = _LANE[v.dtype]
    keys = v.data[..., 0::2]
    group = (torch.arange(keys.shape[-1]) // group_elems).expand(keys.shape)
    return _permute_pairs(v.data.view(lane), _sorted_order(keys, group))


@op("sort32", "tensor.sort32", "tile.sort32")
def sort32(src, idx):
    for arg, v in (("src", src), ("idx", idx)):
        if not isinstance(v, TensorValue):
            raise OpError(f"pl.sort32: `{arg}` must be a tensor or tile, got {type(v).__name__}")
    if src.dtype not in _LANE:
        raise OpError(f"pl.sort32: src must be pl.FP32 or pl.FP16, got {src.dtype!r} {_shape(src)}")
    if idx.dtype.is_float() or idx.dtype == D.BOOL:
        raise OpError(f"pl.sort32: idx must be an integer index row (pl.UINT32, e.g. pl.arange(0, [1, N], "
                      f"dtype=pl.UINT32)), got {idx.dtype!r} {_shape(idx)}")
    if src.ndim != 2 or src.shape != idx.shape:
        raise OpError(f"pl.sort32: src and idx must both be [rows, N], got src {_shape(src)}, idx {_shape(idx)}")
    rows, n = src.shape
    if n % 32:
        raise OpError(f"pl.sort32: N must be a multiple of 32 (sort32 sorts 32-element blocks), got src {_shape(src)}")
    lane = _LANE[src.dtype]
    order = _block_order(src.data, n)
    values = torch.gather(src.data.view(lane), -1, order)           # raw lanes: every bit pattern kept
    indices = torch.gather(_index_bits(idx.data, lane), -1, order)
    out = torch.stack((values, indices), dim=-1).reshape(rows, 2 * n).view(src.data.dtype)
    _note_index_lanes(out, idx.data, lane)
    pair_lanes.note(out, values, indices)     # (a mask gather of one kind of lane reads these rows)
    return TensorValue(out, src.dtype, None, src.is_tile or idx.is_tile)


def _note_index_lanes(pairs: torch.Tensor, idx: torch.Tensor, lane: torch.dtype) -> None:
    """A recorded run whose idx every replay computes from constants: the index lanes of `pairs` are a permutation
    of idx's, so their range, checked once now, holds for every replay (index gathers need not check them)."""
    if lane is not torch.int32 or not recording.fixed(idx):
        return
    with recording.unrecorded():
        low, high = int(idx.min()), int(idx.max())
    if 0 <= low and high < 2**31 - 1:
        index_range.note(pairs, high + 1, index_range.ODD)


def _block_order(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Per row, the element order sorting each 32-element block descending (stable: ties by position): one sort
    over the blocks as rows of their own (a single block needs no block offsets)."""
    rows = keys.shape[0]
    if n == 32:
        return torch.sort(keys, dim=-1, descending=True, stable=True).indices
    within = torch.sort(keys.reshape(rows, n // 32, 32), dim=-1, descending=True, stable=True).indices
    return (within + torch.arange(0, n, 32).unsqueeze(-1)).reshape(rows, n)   # + each block's start


def _block_len(block_len) -> int:
    if isinstance(block_len, TensorValue):
        block_len = block_len.data.reshape(-1)[0].item()
    if isinstance(block_len, bool) or not isinstance(block_len, int) or block_len <= 0 or block_len % 64:
        raise OpError(f"pl.mrgsort: block_len must be a positive multiple of 64 (run length in pair positions, "
                      f"64 after sort32), got {block_len!r}")
    return block_len


@op("mrgsort", "tensor.mrgsort", "tile.mrgsort")
def mrgsort(src0, src1=None, src2=None, src3=None, tmp=None, exhausted=False, *, block_len=None):
    srcs = [s for s in (src0, src1, src2, src3) if s is not None]
    if block_len is not None:
        if len(srcs) != 1:
            raise OpError(f"pl.mrgsort: block_len= (format 1) takes one pair row, got {len(srcs)} inputs")
        _check_pairs("mrgsort", src0)
        raw = _sort_groups(src0, 2 * _block_len(block_len))  # 4 runs of B/2 elements
        return TensorValue(raw.view(src0.data.dtype), src0.dtype, None, src0.is_tile)
    if len(srcs) < 2:
        raise OpError("pl.mrgsort: pass block_len= (format 1: mrgsort(s, block_len=64)) or 2-4 sorted pair rows "
                      "(format 2: mrgsort(a, b))")
    for s in srcs:
        _check_pairs("mrgsort", s)
    if len({s.dtype for s in srcs}) != 1:
        raise OpError(f"pl.mrgsort: all inputs must share one dtype, got {[s.dtype for s in srcs]}")
    merged = TensorValue(torch.cat([s.data for s in srcs], dim=-1), src0.dtype)
    raw = _sort_groups(merged, merged.shape[-1])
    return TensorValue(raw.view(src0.data.dtype), src0.dtype, None, any(s.is_tile for s in srcs))
