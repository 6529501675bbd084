"""The lanes a sorted pair row was built from (ops.sort): sort32 interleaves a values row and an index row into
one pair row; a mask gather that picks every other position of such a row picks one kind of lane, so it reads a
slice of that lane's own row instead of the interleaved one. A replay then needs neither the interleaving nor the
other kind's lanes when nothing else reads them (dead calls, dropped). A note belongs to the pair row's base
tensor and holds while that tensor lives unwritten (recording.TensorNotes: a write through any view voids it)."""
from __future__ import annotations

import torch

from pypto_rt.ops import recording

_KIND = "pair lanes"   # the notes' kind: (values [rows, N], indices [rows, N]), raw lane bits of the pair row


def _root(t: torch.Tensor) -> torch.Tensor:
    return t if t._base is None else t._base


def note(pairs: torch.Tensor, values: torch.Tensor, indices: torch.Tensor) -> None:
    """`pairs` [rows, 2N] (a fresh tensor or a view covering its base) holds values[r, j] at position 2j and
    indices[r, j] at 2j + 1, as raw bits of its element width."""
    root = _root(pairs)
    if root.numel() == 2 * values.numel() and root.storage_offset() == 0:
        recording.notes().note(root, _KIND, (values, indices))


def lanes_of(t: torch.Tensor, first: int, step: int) -> torch.Tensor | None:
    """`t[..., first::step]` as the slice of the noted lanes it selects (raw bits, [rows, count]) when `t` is a
    row-major 2-D view of a noted pair row and the pattern picks every other position; else None."""
    if step != 2 or t.dim() != 2 or t.stride(-1) != 1:
        return None
    fact = recording.notes().fact(_root(t), _KIND)
    if fact is None:
        return None
    values, indices = fact
    rows, n = values.shape
    if t.element_size() != values.element_size() or (t.shape[0] > 1 and t.stride(0) != 2 * n):
        return None
    row0, col0 = divmod(t.storage_offset(), 2 * n)
    if row0 + t.shape[0] > rows or col0 + t.shape[1] > 2 * n:
        return None
    start, count = col0 + first, max(0, (t.shape[1] - first + 1) // 2)
    lanes = indices if start % 2 else values
    return lanes[row0:row0 + t.shape[0], start // 2:start // 2 + count]
