"""Gather and scatter: `pl.gather` (index, mask and compare forms), `pl.tile.gather` (flat indices),
`pl.scatter` (index and mask forms), `pl.scatter_update` and `pl.gatherb` (`pl.mgather` and `pl.paged_gather`
are in `ops.mgather`). Index forms read only the index's valid box and raise OpError for an index
outside the source; the result of an index gather carries the index's valid box. Mask forms select
columns by `MaskPattern` (bit k of the pattern keeps columns congruent to k mod 4) and their
`output_dtype=` is a bit reinterpretation of the same byte width (how top-k reads the uint32 index
lanes of a sort32 pair row), never a numeric conversion. Duplicate destinations of a scatter are
resolved deterministically: the last writer in row-major order wins (`pl.mscatter`, in `ops.mscatter`,
may leave it unspecified). Compare form (an assumption
from the compiler's type rules, never seen in kernels): `cmp_mode` 0..5 = eq, ne, lt, le, gt, ge;
per row, the columns whose valid element satisfies `x <cmp> kvalue`, in ascending order plus
`offset`, fill `dst[r, :out_cols]` (zeros after), and `counts[0, r]` is the total number of matches.
"""
from __future__ import annotations

import contextlib

import torch

from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.ops import index_range, pair_lanes, recording
from pypto_rt.ops.dtype_rules import storage_dtype, to_dtype
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue, valid_mask

# MaskPattern value -> (first column, stride).
_PATTERNS = {1: (0, 2), 2: (1, 2), 3: (0, 4), 4: (1, 4), 5: (2, 4), 6: (3, 4), 7: (0, 1)}
_RAW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CMP = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
_CMP_NAMES = ("eq", "ne", "lt", "le", "gt", "ge")


# ----------------------------------------------------------------------------------------- helpers
def _shape(v) -> list[int]:
    return list(v.shape)


def _check_value(name: str, arg: str, v) -> None:
    if not isinstance(v, TensorValue):
        raise OpError(f"pl.{name}: `{arg}` must be a tensor or tile, got {type(v).__name__}")


def _check_index(name: str, idx: TensorValue) -> None:
    if idx.dtype.is_float() or idx.dtype == D.BOOL:
        raise OpError(f"pl.{name}: indices must be an integer tensor (INT32), got {idx.dtype!r} "
                      f"{_shape(idx)}; pl.cast them to pl.INT32 first")


def _raw_bits(data: torch.Tensor, dtype) -> torch.Tensor:
    """The bit patterns of `data` as a signed integer tensor of the pl dtype's byte width."""
    width = dtype.get_byte()
    raw = _RAW[width]
    if data.dtype == torch.bool:
        return data.to(torch.int8)
    if data.element_size() == width:
        return data.view(raw)
    half = 1 << (8 * width - 1)  # UINT16/UINT32 live in wider storage: wrap to the narrow pattern
    low = data.to(torch.int64) & ((half << 1) - 1)
    return torch.where(low >= half, low - (half << 1), low).to(raw)


def _from_raw_bits(raw: torch.Tensor, dtype) -> torch.Tensor:
    """Inverse of `_raw_bits`: storage tensor of `dtype` holding these bit patterns."""
    store = storage_dtype(dtype)
    if store == torch.bool:
        return raw != 0
    if raw.dtype == store:
        return raw
    if torch.empty((), dtype=store).element_size() == raw.element_size():
        return raw.view(store)
    return raw.to(torch.int64).to(store) & ((1 << (8 * raw.element_size())) - 1)


def _index_long(name: str, idx: TensorValue) -> torch.Tensor:
    """Index values as int64; entries outside the index's valid box are replaced by 0."""
    _check_index(name, idx)
    data = idx.data.to(torch.int64)
    if idx.dtype == D.UINT32:
        data = data & 0xFFFFFFFF
    mask = valid_mask(idx)
    return data if mask is None else torch.where(mask, data, 0)


def _check_bounds(name: str, index: torch.Tensor, bound: int, what: str, non_negative: bool = False) -> None:
    """OpError unless every index lies in 0..bound-1. A recorded run records the check for its replays (asserted,
    without reading the indices into Python), in fewer calls where `non_negative` (the caller made them so), and
    checks indices every replay computes from constants once, now."""
    if recording.recording() and not recording.fixed(index):   # (asked before its size: an index whose length
        inside = (index < bound) if non_negative else (index.clamp(0, bound - 1) == index)   # follows data)
        torch._assert_async(inside.all(), f"pl.{name}: an index is outside {what} (valid range 0..{bound - 1})")
        return
    if not index.numel():
        return
    if recording.fixed(index):
        with recording.unrecorded():
            return _check_bounds_now(name, index, bound, what)
    _check_bounds_now(name, index, bound, what)


def _check_bounds_now(name: str, index: torch.Tensor, bound: int, what: str) -> None:
    if int(index.min()) < 0 or int(index.max()) >= bound:
        bad = index[(index < 0) | (index >= bound)][0]
        raise OpError(f"pl.{name}: index {int(bad)} is outside {what} (valid range 0..{bound - 1})")


def _as_words(rows: torch.Tensor) -> torch.Tensor | None:
    """Contiguous [n, d] rows of a 2-byte dtype (bf16, fp16, int16) with even d viewed as [n, d / 2] FP32 words,
    else None. torch's CPU index_select and index_copy_ move float rows with vector copies, 2-byte ones element by
    element (2-3x slower: a [8192, 1024] bf16 row gather 29 ms against 12 ms); a copy moves the bits unchanged."""
    if rows.dim() != 2 or rows.element_size() != 2 or rows.shape[1] % 2 or not rows.is_contiguous():
        return None
    return rows.view(torch.float32)


def _last_written(targets: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per write i (flat `targets`, `values` one row each), the value the last write to its target
    writes: assigning these, duplicate targets all write the same value, so the last write wins whatever order
    the assignment takes. Shapes do not depend on the data (a recorded run replays it), and the cost follows the
    writes, not the destination's size (a scatter of a few rows into a large cache stays cheap)."""
    if targets.numel() < 2:
        return values
    fixed = recording.fixed(targets)
    if recording.recording() and not fixed:   # (a recording reads no index it cannot fix: every replay sorts)
        return _rows_at(values, _last_positions(*torch.sort(targets, stable=True), targets))
    with recording.unrecorded() if fixed else contextlib.nullcontext():   # fixed: the same targets every replay,
        winners = _winners(targets)                                       # resolved once, now
    return values if winners is None else _rows_at(values, winners)


def _rows_at(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """values[positions] (int64 positions along dim 0); 2-byte rows move as FP32 words (`_as_words`)."""
    words = _as_words(values)
    return values[positions] if words is None else words.index_select(0, positions).view(values.dtype)


def _winners(targets: torch.Tensor) -> torch.Tensor | None:
    """Per write, the position of the last write to its target; None when the targets are distinct."""
    ordered, order = torch.sort(targets, stable=True)
    if bool((ordered.diff() != 0).all()):
        return None
    return _last_positions(ordered, order, targets)


def _last_positions(ordered: torch.Tensor, order: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per write, the position of the last write to its target, from the targets' stable sort (ordered, order)."""
    return order[torch.searchsorted(ordered, targets, right=True) - 1]


def _write_flat(name: str, out: TensorValue, targets: torch.Tensor, values: torch.Tensor) -> None:
    """out.flat[targets] = values in place (works on non-contiguous views); last write wins."""
    _check_bounds(name, targets, out.data.numel(), f"the destination {_shape(out)} ({out.data.numel()} elements)")
    coords = torch.unravel_index(targets, out.shape) if out.ndim else ()
    out.data[coords] = _last_written(targets, values).to(out.data.dtype)


def _pattern(name: str, mask_pattern) -> tuple[int, int]:
    try:
        return _PATTERNS[int(mask_pattern)]
    except (KeyError, TypeError, ValueError):
        raise OpError(f"pl.{name}: mask_pattern must be a pl.tile.MaskPattern (1..7), got {mask_pattern!r}") from None


def _selected_count(extent: int, first: int, step: int) -> int:
    return max(0, (extent - first + step - 1) // step)


# ------------------------------------------------------------------------------- gather: 3 forms
def _gather_index(name: str, x: TensorValue, dim, index: TensorValue) -> TensorValue:
    _check_value(name, "index", index)
    if index.ndim != x.ndim:
        raise OpError(f"pl.{name}: index rank {index.ndim} {_shape(index)} must equal input rank "
                      f"{x.ndim} {_shape(x)}")
    axis = int(dim) + x.ndim if int(dim) < 0 else int(dim)
    if not 0 <= axis < x.ndim:
        raise OpError(f"pl.{name}: dim={dim} is out of range for input {_shape(x)}")
    for d in range(x.ndim):
        if d != axis and index.shape[d] > x.shape[d]:
            raise OpError(f"pl.{name}: index {_shape(index)} is larger than input {_shape(x)} on axis {d}")
    idx = _index_long(name, index)
    proven = index_range.bound_of(index.data)
    if proven is None or proven > x.shape[axis]:
        _check_bounds(name, idx, x.shape[axis], f"axis {axis} of the input {_shape(x)}")
    out = torch.gather(x.data, axis, idx)
    return TensorValue(out, x.dtype, index.valid, x.is_tile)


def _gather_mask(name: str, x: TensorValue, mask_pattern, output_dtype) -> TensorValue:
    first, step = _pattern(name, mask_pattern)
    out_dt = x.dtype if output_dtype is None else to_dtype(output_dtype)
    if out_dt.get_byte() != x.dtype.get_byte():
        raise OpError(f"pl.{name}: output_dtype {out_dt!r} reinterprets the bits of {x.dtype!r}, so it must have "
                      f"the same byte width ({x.dtype.get_byte()}); use pl.cast for a numeric conversion")
    if x.ndim < 1:
        raise OpError(f"pl.{name}: mask form needs at least one axis, got a scalar tensor")
    lanes = pair_lanes.lanes_of(x.data, first, step)    # (a sort32 pair row: its lanes' own row, same bits)
    if lanes is not None:
        data = _from_raw_bits(lanes, out_dt).clone()
    else:
        cols = x.data[..., first::step]
        data = cols.clone() if out_dt == x.dtype else _from_raw_bits(_raw_bits(cols, x.dtype), out_dt).clone()
    bound = index_range.bound_of(x.data, first, step)
    if bound is not None and not out_dt.is_float() and out_dt.get_byte() == 4:   # (int bits of proven lanes)
        index_range.note(data, bound, index_range.ALL)
    valid = None
    if x.valid is not None:
        valid = x.valid[:-1] + (_selected_count(x.valid[-1], first, step),)
    return TensorValue(data, out_dt, valid, x.is_tile)


def _cmp_mode(name: str, cmp_mode) -> str:
    if isinstance(cmp_mode, str) and cmp_mode in _CMP:
        return cmp_mode
    if isinstance(cmp_mode, int) and not isinstance(cmp_mode, bool) and 0 <= cmp_mode < len(_CMP_NAMES):
        return _CMP_NAMES[cmp_mode]
    raise OpError(f"pl.{name}: cmp_mode must be one of {list(_CMP_NAMES)} or 0..5, got {cmp_mode!r}")


def _gather_compare(name: str, x: TensorValue, kvalue, cmp_mode, out_cols, offset, count_dtype):
    mode = _cmp_mode(name, cmp_mode)
    if x.ndim != 2:
        raise OpError(f"pl.{name}: compare form needs a 2-D input, got {_shape(x)}")
    if not isinstance(out_cols, int) or out_cols <= 0:
        raise OpError(f"pl.{name}: compare form needs out_cols > 0, got {out_cols!r}")
    cdt = D.INT32 if count_dtype is None else to_dtype(count_dtype)
    if cdt not in (D.INT32, D.UINT32):
        raise OpError(f"pl.{name}: count_dtype must be pl.INT32 or pl.UINT32, got {cdt!r}")
    if isinstance(kvalue, TensorValue):
        kvalue = kvalue.data.reshape(-1)[0].item()
    threshold = torch.tensor(kvalue).to(x.data.dtype)
    hits = _CMP[mode](x.data, threshold)
    mask = valid_mask(x)
    if mask is not None:
        hits = hits & mask
    rows, width = x.shape
    cols = torch.arange(width).expand(rows, width)
    # A match's place is the matches before it in its row (a running count); the others go to a spill column past
    # the row. One scan and one scatter: a stable sort of the rows cost 2-3x as much replayed or compiled
    # (the 8-rank MoE combine's [1024, 6] and [6, 1024] compactions: ~300 against ~105 us a call, compiled).
    place = torch.where(hits, hits.cumsum(-1) - 1, width)
    packed = torch.zeros(rows, width + 1, dtype=torch.int64).scatter_(1, place, cols)
    counts = hits.sum(-1)
    take = min(out_cols, width)
    dst = torch.zeros(rows, out_cols, dtype=torch.int32)
    keep = torch.arange(take).expand(rows, take) < counts.unsqueeze(1)
    dst[:, :take] = torch.where(keep, packed[:, :take] + int(offset), 0).to(torch.int32)
    cnt = counts.reshape(1, rows).to(storage_dtype(cdt))
    return TensorValue(dst, D.INT32, None, x.is_tile), TensorValue(cnt, cdt, None, x.is_tile)


@op("gather", "tensor.gather")
def gather(input, dim=None, index=None, *, mask_pattern=None, output_dtype=None, kvalue=None, cmp_mode=None,
           out_cols=None, offset=0, count_dtype=None):
    _check_value("gather", "input", input)
    forms = [f for f, on in (("index (dim=, index=)", dim is not None or index is not None),
                             ("mask (mask_pattern=)", mask_pattern is not None or output_dtype is not None),
                             ("compare (kvalue=, cmp_mode=, out_cols=)",
                              kvalue is not None or cmp_mode is not None or out_cols is not None)) if on]
    if len(forms) != 1:
        raise OpError("pl.gather: pass exactly one form: index (dim=-1, index=idx), mask (mask_pattern=P) "
                      f"or compare (kvalue=, cmp_mode=, out_cols=); got {forms or 'none'}")
    if forms[0].startswith("index"):
        if index is None:
            raise OpError(f"pl.gather: index form needs index=, got only dim={dim} for input {_shape(input)}")
        return _gather_index("gather", input, -1 if dim is None else dim, index)
    if forms[0].startswith("mask"):
        if mask_pattern is None:
            raise OpError("pl.gather: output_dtype= belongs to the mask form; pass mask_pattern= too")
        return _gather_mask("gather", input, mask_pattern, output_dtype)
    if kvalue is None or cmp_mode is None or out_cols is None:
        raise OpError("pl.gather: compare form needs all of kvalue=, cmp_mode= and out_cols=")
    return _gather_compare("gather", input, kvalue, cmp_mode, out_cols, offset, count_dtype)


@op("tile.gather")
def tile_gather(src, indices=None, tmp=None, *, mask_pattern=None, output_dtype=None):
    _check_value("tile.gather", "src", src)
    if mask_pattern is not None:
        if indices is not None:
            raise OpError("pl.tile.gather: pass either indices or mask_pattern=, not both")
        return _gather_mask("tile.gather", src, mask_pattern, output_dtype)
    if indices is None:
        raise OpError(f"pl.tile.gather: needs an index tile (flat indices into src {_shape(src)}) or mask_pattern=")
    _check_value("tile.gather", "indices", indices)
    idx = _index_long("tile.gather", indices)
    flat = src.data.reshape(-1)
    _check_bounds("tile.gather", idx, flat.numel(), f"the source {_shape(src)} ({flat.numel()} elements)")
    return TensorValue(flat[idx], src.dtype, indices.valid, src.is_tile or indices.is_tile)


@op("tile.gather_mask")
def tile_gather_mask(src, mask_pattern, *, output_dtype=None):
    _check_value("tile.gather_mask", "src", src)
    return _gather_mask("tile.gather_mask", src, mask_pattern, output_dtype)


@op("tile.gather_compare")
def tile_gather_compare(src, kvalue, tmp=None, *, cmp_mode="eq", offset=0, out_cols=None, count_dtype=None):
    _check_value("tile.gather_compare", "src", src)
    return _gather_compare("tile.gather_compare", src, kvalue, cmp_mode, out_cols, offset, count_dtype)


# ---------------------------------------------------------------------------------------- scatter
def _scatter_mask(name: str, src: TensorValue, mask_pattern, dst: TensorValue) -> TensorValue:
    _check_value(name, "dst", dst)
    first, step = _pattern(name, mask_pattern)
    target = dst.data[..., first::step]
    if tuple(target.shape) != src.shape:
        raise OpError(f"pl.{name}: src {_shape(src)} does not fit the {list(target.shape)} columns that "
                      f"mask_pattern {int(mask_pattern)} selects in dst {_shape(dst)}")
    target.copy_(src.data)
    return dst


def _scatter_index(name: str, x: TensorValue, dim, index: TensorValue, src: TensorValue) -> TensorValue:
    _check_value(name, "index", index)
    _check_value(name, "src", src)
    if x.ndim != 2 or index.shape != src.shape or index.ndim != 2 or index.shape[0] > x.shape[0]:
        raise OpError(f"pl.{name}: index form needs a 2-D input [rows, S] and index/src of one shape [rows, K], "
                      f"got input {_shape(x)}, index {_shape(index)}, src {_shape(src)}")
    if int(dim) not in (-1, 1):
        raise OpError(f"pl.{name}: index form scatters along dim=-1 only, got dim={dim}")
    idx = _index_long(name, index)
    _check_bounds(name, idx, x.shape[1], f"the {x.shape[1]} columns of the input {_shape(x)}")
    mask = valid_mask(index)
    rows = torch.arange(idx.shape[0]).unsqueeze(1).expand(idx.shape)
    out = TensorValue(x.data.clone(), x.dtype, x.valid, x.is_tile)
    targets, values = rows * x.shape[1] + idx, src.data
    if mask is not None:   # (a fully valid index selects nothing: the shapes stay static for a replay)
        live = mask.expand(idx.shape)
        targets, values = targets[live], values[live]
    _write_flat(name, out, targets.reshape(-1), values.reshape(-1))
    return out


@op("scatter", "tensor.scatter")
def scatter(input, dim=None, index=None, src=None, *, mask_pattern=None, dst=None):
    _check_value("scatter", "input", input)
    is_index = dim is not None or index is not None or src is not None
    is_mask = mask_pattern is not None or dst is not None
    if is_index == is_mask:
        raise OpError("pl.scatter: pass exactly one form: index (dim=-1, index=idx, src=s) or mask "
                      "(mask_pattern=P, dst=buf)")
    if is_mask:
        if mask_pattern is None or dst is None:
            raise OpError("pl.scatter: mask form needs both mask_pattern= and dst=")
        return _scatter_mask("scatter", input, mask_pattern, dst)
    if index is None or src is None:
        raise OpError("pl.scatter: index form needs index= and src=")
    return _scatter_index("scatter", input, -1 if dim is None else dim, index, src)


@op("tile.scatter")
def tile_scatter(dst, src, indexes):
    for arg, v in (("dst", dst), ("src", src), ("indexes", indexes)):
        _check_value("tile.scatter", arg, v)
    if indexes.shape != src.shape:
        raise OpError(f"pl.tile.scatter: indexes {_shape(indexes)} must have the shape of src {_shape(src)}")
    live = valid_mask(indexes)
    live = torch.ones(src.shape, dtype=torch.bool) if live is None else live.expand(src.shape)
    _write_flat("tile.scatter", dst, _index_long("tile.scatter", indexes)[live], src.data[live])
    return dst


@op("tile.scatter_mask")
def tile_scatter_mask(dst, src, mask_pattern):
    _check_value("tile.scatter_mask", "src", src)
    return _scatter_mask("tile.scatter_mask", src, mask_pattern, dst)


def _scatter_update_args(args, kwargs):
    """Accept (dim, index, src), (index, src, dim=) and (dim, index=, src=)."""
    names = ["dim", "index", "src"] if args and not isinstance(args[0], TensorValue) else ["index", "src", "dim"]
    if len(args) > 3:
        raise OpError("pl.scatter_update: takes (input, dim, index, src)")
    got = dict(zip(names, args))
    for key, val in kwargs.items():
        if key not in ("dim", "index", "src") or key in got:
            raise OpError(f"pl.scatter_update: unexpected or repeated argument {key!r}")
        got[key] = val
    if "index" not in got or "src" not in got:
        raise OpError("pl.scatter_update: needs index and src (pl.scatter_update(input, dim, index, src))")
    return got["index"], got["src"]


@op("scatter_update", "tensor.scatter_update", "tile.scatter_update")
def scatter_update(input, *args, **kwargs):
    index, src = _scatter_update_args(args, kwargs)
    for arg, v in (("input", input), ("index", index), ("src", src)):
        _check_value("scatter_update", arg, v)
    if input.ndim not in (2, 4) or (input.ndim == 4 and input.shape[2] != 1):
        raise OpError(f"pl.scatter_update: input must be [rows, d] or [blocks, block_size, 1, d], got {_shape(input)}")
    d = input.shape[-1]
    rows = src.data.reshape(-1, d) if src.shape and src.shape[-1] == d else None
    idx = _index_long("scatter_update", index).reshape(-1)
    if rows is None or rows.shape[0] != idx.numel():
        raise OpError(f"pl.scatter_update: src {_shape(src)} must hold one row of width {d} per index entry "
                      f"(index {_shape(index)} has {idx.numel()})")
    n_rows = input.data.numel() // d
    _check_bounds("scatter_update", idx, n_rows, f"the {n_rows} rows of input {_shape(input)}")
    rows = _last_written(idx, rows).to(input.data.dtype)
    words, row_words = _as_words(input.data), _as_words(rows)
    if words is not None and row_words is not None:   # (repeated targets write equal rows: any order)
        words.index_copy_(0, idx, row_words)
    elif input.ndim == 2:
        input.data[idx] = rows
    else:
        bs = input.shape[1]
        input.data[idx // bs, idx % bs, 0] = rows
    return input


# ---------------------------------------------------------------------- block / memory gathers
@op("gatherb", "tile.gatherb")
def gatherb(src, offset, *, output_dtype=None):
    _check_value("gatherb", "src", src)
    _check_value("gatherb", "offset", offset)
    out_dt = src.dtype if output_dtype is None else to_dtype(output_dtype)
    if offset.ndim != 2:
        raise OpError(f"pl.gatherb: offset must be a 2-D [rows, blocks] tile of byte offsets, got {_shape(offset)}")
    per_block = 32 // out_dt.get_byte()
    src_bytes = _raw_bits(src.data.contiguous(), src.dtype).contiguous().view(torch.uint8).reshape(-1)
    offs = _index_long("gatherb", offset)
    _check_bounds("gatherb", offs, src_bytes.numel() - 31, f"the {src_bytes.numel()}-byte source {_shape(src)}")
    rows, blocks = offset.shape
    picked = src_bytes[offs.unsqueeze(-1) + torch.arange(32)]  # [rows, blocks, 32]
    mask = valid_mask(offset)
    if mask is not None:
        picked = torch.where(mask.unsqueeze(-1), picked, 0)
    raw = picked.reshape(rows, blocks * 32).view(_RAW[out_dt.get_byte()])
    valid = None if offset.valid is None else (offset.valid[0], offset.valid[1] * per_block)
    return TensorValue(_from_raw_bits(raw, out_dt), out_dt, valid, src.is_tile or offset.is_tile)
