"""Integer lanes an op knows to lie in 0..bound-1 without reading them (a local proof): index gathers skip their
bounds check on them. sort32 notes the index lanes of its pair row when its idx is computed from constants (the
lanes are a permutation of idx, whatever the values sorted); the mask gather carries the proof to the lanes it
selects. A proof belongs to one tensor and its views (one storage, one version counter): any in-place write to
any of them since the note voids it, and a view that reaches lanes outside the proven ones is not covered.
Proofs are notes of the run that made them (`recording.notes()`): one recorded for replay sees only its own, so a
proof about a tensor another run computed (whose contents a replay reads afresh) never skips a recorded check.
"""
from __future__ import annotations

import torch

from pypto_rt.ops import recording

ALL, ODD = "all", "odd"    # which elements of the storage are proven: every one, or the odd flat positions
_KIND = "index range"      # the notes' kind: (bound, lanes, element size when noted)


def _root(t: torch.Tensor) -> torch.Tensor:
    return t if t._base is None else t._base


def note(t: torch.Tensor, bound: int, lanes: str) -> None:
    """Every `lanes` element of `t`'s storage (which `t`, a fresh tensor or a view of one, must cover) is an integer
    in 0..bound-1 as read in t's dtype."""
    root = _root(t)
    if (t.dtype.is_floating_point and lanes == ALL) or root.untyped_storage().nbytes() != root.nbytes:
        return
    recording.notes().note(root, _KIND, (bound, lanes, root.element_size()))


def bound_of(t: torch.Tensor, first: int = 0, step: int = 1) -> int | None:
    """The bound B when every element of `t[..., first::step]` is proven to lie in 0..B-1 (read in t's dtype for
    ALL lanes, as the same-width integer bits for ODD ones), else None."""
    root = _root(t)
    proof = recording.notes().fact(root, _KIND)
    if proof is None or t.element_size() != proof[2]:
        return None
    bound, lanes = proof[0], proof[1]
    if lanes == ALL:
        return bound if t.dtype == root.dtype else None
    strides = t.stride()
    if not strides:
        return bound if t.storage_offset() % 2 else None
    outer = all(s % 2 == 0 for s, n in zip(strides[:-1], t.shape[:-1]) if n > 1)
    last = strides[-1]
    odd = (t.storage_offset() + first * last) % 2 == 1 and (step * last % 2 == 0 or t.shape[-1] <= first + step)
    return bound if outer and odd else None
