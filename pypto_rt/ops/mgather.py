"""Memory gathers: `pl.mgather` (rows or elements of a memory at index positions, with the ISA's `gather_oob`
policies: undefined (bounds-checked here), clamp, wrap, zero) and `pl.paged_gather` (rows through a block table).
Row gathers of 2-byte data with an even width move as FP32 words (`ops.gather._as_words`: same bits, torch's vector
row copy). `pl.mscatter`, the matching scatter, is in `ops.mscatter`.
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.ops.gather import _as_words, _check_bounds, _check_value, _index_long, _shape
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue, valid_mask

_OOB_MODES = ("undefined", "clamp", "wrap", "zero")


def _oob_mode(name: str, mode) -> str:
    """gather_oob by name (an int 0..3 names one of _OOB_MODES)."""
    mode = _OOB_MODES[mode] if isinstance(mode, int) and 0 <= mode < 4 else mode
    if mode not in _OOB_MODES:
        raise OpError(f"pl.{name}: gather_oob must be one of {list(_OOB_MODES)} or 0..3, got {mode!r}")
    return mode


def _oob(name: str, idx: torch.Tensor, bound: int, mode) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Apply gather_oob; returns (in-range indices, mask of entries to keep, None: all of them; only "zero"
    drops any)."""
    mode = _oob_mode(name, mode)
    if mode == "undefined":
        _check_bounds(name, idx, bound, f"the {bound} gatherable entries (pass gather_oob= to allow it)",
                      non_negative=True)   # (read as uint32)
        return idx, None
    if mode == "clamp":
        return idx.clamp(0, bound - 1), None
    if mode == "wrap":
        return idx.remainder(bound), None
    keep = idx < bound
    return torch.where(keep, idx, 0), keep


@op("mgather", "tile.mgather")
def mgather(mem, idx, coalesce="row", *, gather_oob="undefined", target_memory=None, scratch=None,
            valid_shape=None):
    _check_value("mgather", "mem", mem)
    _check_value("mgather", "idx", idx)
    mode = {0: "row", 1: "elem"}.get(coalesce, coalesce)
    if mode not in ("row", "elem"):
        raise OpError(f"pl.mgather: coalesce must be 'row' or 'elem', got {coalesce!r}")
    # (`[n, 1]` asked column first: n may be a row count that follows data, which a replay must not compare with 1)
    if idx.ndim != 2 or (mode == "row" and mem.ndim != 2) or (
            mode == "row" and idx.shape[-1] != 1 and idx.shape[0] != 1):
        raise OpError(f"pl.mgather: needs a 2-D index ([1, n] or [n, 1] for row mode) and, for row mode, a 2-D mem; "
                      f"got mem {_shape(mem)}, idx {_shape(idx)}")
    boxed = valid_mask(idx)   # None: every index entry is valid (no mask made, no pass over the gathered rows)
    live = None if boxed is None else boxed.expand(idx.shape)
    raw = idx.data.to(torch.int64) & 0xFFFFFFFF
    if mode == "row":
        table, raw = mem.data, raw.reshape(-1)
        live = None if live is None else live.reshape(-1)
        valid = (raw.numel() if live is None else int(live.sum()), mem.shape[1])
    else:
        table, valid = mem.data.reshape(-1), idx.valid
    oob = _oob_mode("mgather", gather_oob)
    pos, keep = _oob("mgather", raw if live is None else torch.where(live, raw, 0), table.shape[0], oob)
    if mode == "row":
        words = _as_words(table)
        out = table.index_select(0, pos) if words is None else words.index_select(0, pos).view(table.dtype)
    else:
        out = table[pos]
    if keep is not None or live is not None:   # zero the rows of invalid or dropped entries
        keep = live if keep is None else keep if live is None else keep & live
        out = torch.where(keep.reshape(keep.shape + (1,) * (out.ndim - keep.ndim)), out,
                          torch.zeros((), dtype=out.dtype))
    if valid_shape is not None:
        valid = tuple(min(int(a), int(b)) for a, b in zip(valid or out.shape, valid_shape))
    result = TensorValue(out, mem.dtype, valid, True)
    mask = valid_mask(result)
    if mask is not None:
        result.data = torch.where(mask, out, torch.zeros((), dtype=out.dtype))
    return result


@op("paged_gather", "tensor.paged_gather", "tile.paged_gather")
def paged_gather(src, indices, block_table, block_size, size, max_indices, *, space=None, col_off=0,
                 is_trans=False, is_b_matrix=False):
    for arg, v in (("src", src), ("indices", indices), ("block_table", block_table)):
        _check_value("paged_gather", arg, v)
    if src.ndim != 2 or indices.ndim not in (1, 2) or (indices.ndim == 2 and indices.shape[0] != 1):
        raise OpError(f"pl.paged_gather: needs a 2-D src and indices [n] or [1, n], got src {_shape(src)}, "
                      f"indices {_shape(indices)}")
    bs, size, max_indices, col_off = int(block_size), int(size), int(max_indices), int(col_off)
    if bs <= 0 or size <= 0 or col_off < 0 or col_off + size > src.shape[1]:
        raise OpError(f"pl.paged_gather: block_size={bs}, size={size}, col_off={col_off} do not fit src {_shape(src)}")
    idx = _index_long("paged_gather", indices).reshape(-1)[: indices.valid_shape[-1]]
    if idx.numel() > max_indices:
        raise OpError(f"pl.paged_gather: {idx.numel()} indices exceed max_indices={max_indices}")
    table = _index_long("paged_gather", block_table).reshape(-1)
    _check_bounds("paged_gather", idx // bs, table.numel(), f"the block table {_shape(block_table)}")
    phys = table[idx // bs] * bs + idx % bs
    _check_bounds("paged_gather", phys, src.shape[0], f"the {src.shape[0]} rows of src {_shape(src)}")
    out = torch.zeros(max_indices, size, dtype=src.data.dtype)
    out[: idx.numel()] = src.data[phys, col_off:col_off + size]
    valid = (idx.numel(), size)
    if is_trans:
        out, valid = out.t().contiguous(), (size, idx.numel())
    return TensorValue(out, src.dtype, valid, src.is_tile)
