"""`pl.mscatter`: a scatter into memory with the ISA's MSCATTER policies. `coalesce` ("elem":
`out.flat[idx[i, j]] = src[i, j]`, the default; "row": `out[idx[r], :] = src[r, :]`), `scatter_oob` (how an
index read as uint32 past the target is taken: "undefined" raises OpError, "skip" writes nothing, "clamp",
"wrap") and `scatter_conflict` ("last": the last writer in row-major order wins, as every scatter of
`ops.gather`; "default": the survivor of a repeated index is unspecified, as the ISA's, and that pass is skipped).
`some_kept` is this runtime's hint, not an ISA field: the caller guarantees that every call keeps at least one
row of a "skip" row scatter (write_kv_cache checks its slots on the host), so skipped rows can rewrite a kept row
with its own data instead of a spare row that must be found, read and put back.
"""
from __future__ import annotations

import torch

from pypto_rt.errors import OpError
from pypto_rt.ops import recording
from pypto_rt.ops.gather import _as_words, _check_bounds, _check_value, _index_long, _last_written, _shape
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import valid_mask

_SCATTER_OOB = ("undefined", "skip", "clamp", "wrap")      # pto ScatterOOB, in its enum order
_SCATTER_CONFLICT = ("last", "default")                     # pto ScatterConflict


def _policy(name: str, arg: str, value, choices: tuple) -> str:
    """A policy given by name or by its enum value (0..len-1)."""
    value = choices[value] if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(choices) \
        else value
    if value not in choices:
        raise OpError(f"pl.{name}: {arg} must be one of {list(choices)} or 0..{len(choices) - 1}, got {value!r}")
    return value


def _scatter_targets(name: str, index: torch.Tensor, limit: int, oob: str, what: str):
    """(targets, keep) for int64 `index` into `limit` units under ScatterOOB `oob`; keep is None unless "skip".
    Past "undefined", an index is read as the ISA reads it, as uint32 (so -1 is past any target)."""
    if oob == "undefined":
        _check_bounds(name, index, limit, what)
        return index, None
    raw = index & 0xFFFFFFFF
    if oob == "clamp":
        return raw.clamp(max=limit - 1), None
    if oob == "wrap":
        return raw.remainder(limit), None
    return raw, raw < limit


def _spare_unit(targets: torch.Tensor) -> torch.Tensor:
    """The first of units 0..n (n = targets.numel()) that no target names, as a [1] index (a 0-d one would index
    a view, not a copy): with one write skipped, at most n - 1 kept targets name units below n, so one of 0..n-1
    is free. O(n), with data-free shapes."""
    n = targets.numel()
    return torch.zeros(n + 1, dtype=torch.int8).scatter(0, targets.clamp(max=n), 1).argmin(0, keepdim=True)


@op("mscatter", "tile.mscatter")
def mscatter(src, idx, output_tensor, coalesce="elem", *, scatter_oob="undefined", scatter_conflict="last",
             some_kept=False):
    for arg, v in (("src", src), ("idx", idx), ("output_tensor", output_tensor)):
        _check_value("mscatter", arg, v)
    mode = _policy("mscatter", "coalesce", coalesce, ("row", "elem"))
    oob = _policy("mscatter", "scatter_oob", scatter_oob, _SCATTER_OOB)
    conflict = _policy("mscatter", "scatter_conflict", scatter_conflict, _SCATTER_CONFLICT)
    if not isinstance(some_kept, bool) or (some_kept and (mode, oob) != ("row", "skip")):
        raise OpError(f"pl.mscatter: some_kept must be a bool, and True only with coalesce='row' and "
                      f"scatter_oob='skip' (got {some_kept!r} with {mode!r}, {oob!r})")
    if mode == "row":
        return _mscatter_rows(src, idx, output_tensor, oob, conflict, some_kept)
    if idx.shape != src.shape:
        raise OpError(f"pl.mscatter: idx {_shape(idx)} must have the shape of src {_shape(src)}")
    live = torch.ones(src.shape, dtype=torch.bool)
    for v in (src, idx):
        m = valid_mask(v)
        live = live if m is None else live & m
    out = output_tensor
    targets, keep = _scatter_targets("mscatter", _index_long("mscatter", idx)[live], out.data.numel(), oob,
                                     f"the destination {_shape(out)} ({out.data.numel()} elements)")
    coords = (lambda t: torch.unravel_index(t, out.shape)) if out.ndim else (lambda t: ())
    _mscatter_write_units(out.data, targets, src.data[live], keep, conflict, coords, out.data.numel(), False)
    return output_tensor


def _mscatter_rows(src, idx, out, oob: str, conflict: str, some_kept: bool = False):
    """coalesce="row": out[idx[r], :] = src[r, :] over src's valid rows (idx [1, R] or [R, 1], out [rows, C])."""
    rows, cols = src.valid_shape if src.ndim == 2 else (None, None)
    if src.ndim != 2 or out.ndim != 2 or idx.ndim != 2 or (idx.shape[-1] != 1 and idx.shape[0] != 1) or \
            idx.data.numel() != src.shape[0] or cols != out.shape[1]:
        raise OpError(f"pl.mscatter: coalesce='row' needs src [R, C] (C valid columns), idx [1, R] or [R, 1] and "
                      f"output_tensor [rows, C]; got src {_shape(src)}, idx {_shape(idx)}, output_tensor "
                      f"{_shape(out)}")
    index = _index_long("mscatter", idx).reshape(-1)
    values = src.data if src.valid is None else src.data[:rows, :cols]
    targets, keep = _scatter_targets("mscatter", index if rows == index.numel() else index[:rows], out.shape[0],
                                     oob, f"the {out.shape[0]} rows of output_tensor {_shape(out)}")
    if some_kept and out.shape[0] > targets.numel():
        _redirect_skipped_rows(out.data, targets, values if conflict == "default" else _last_written(targets, values),
                               keep)
    else:
        _mscatter_write_units(out.data, targets, values, keep, conflict, lambda t: t, out.shape[0], True)
    return out


def _redirect_skipped_rows(out_data, targets, values, keep) -> None:
    """out_data[targets[r]] = values[r] for the kept rows, with at least one kept (`some_kept`; repeated targets
    already carry their last write's values under "last"): each skipped row takes the kept row of the smallest
    target, its target and its data, so duplicate writes carry equal bits and their order does not matter (argmin,
    where and a gather of the targets, then 2 calls per target: no spare row to find, read and put back). With
    none kept the write raises before writing anything (here, or as torch's index error in a replay)."""
    if not recording.recording() and not bool(keep.any()):
        raise OpError("pl.mscatter: some_kept=True, but every index is skipped (past the target): the caller "
                      "promised at least one kept row; call it only when one is (or leave some_kept False)")
    first = targets.argmin(0, keepdim=True)      # kept: a kept target is below every skipped one (< limit <= them)
    rows = torch.where(keep, torch.arange(targets.numel()), first)
    out_data.index_copy_(0, targets.index_select(0, rows), values.index_select(0, rows).to(out_data.dtype))


def _mscatter_write_units(out_data, targets, values, keep, conflict, at, limit: int, rows: bool) -> None:
    """out_data[at(targets)] = values (index_copy_ along dim 0 for whole rows); the last write wins under "last".
    Skipped writes (keep False) go to a spare unit no kept write names, whose value is put back after: shapes never
    depend on the data, so a recorded run replays it. With no room for a spare (limit <= n) only the kept writes
    are made (their number depends on the data: such a run is not replayed)."""
    spare = None
    if keep is not None and limit <= targets.numel():
        targets, values = targets[keep], values[keep]
    elif keep is not None:
        spare = _spare_unit(targets)
        targets = torch.where(keep, targets, spare)
        saved = out_data.index_select(0, spare) if rows else out_data[at(spare)]
    if conflict == "last":
        values = _last_written(targets, values)
    if rows:
        values = values.to(out_data.dtype)
        words, value_words = _as_words(out_data), _as_words(values)   # 2-byte rows move as FP32 words
        if words is not None and value_words is not None:
            words.index_copy_(0, targets, value_words)
        else:
            out_data.index_copy_(0, targets, values)
    else:
        out_data[at(targets)] = values.to(out_data.dtype)
    if spare is not None and rows:
        out_data.index_copy_(0, spare, saved)
    elif spare is not None:
        out_data[at(spare)] = saved
