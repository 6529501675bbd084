"""Integer lanes an op knows to lie in 0..bound-1 without reading them (a local proof): index gathers skip their
bounds check on them. sort32 notes the index lanes of its pair row when its idx is computed from constants (the
lanes are a permutation of idx, whatever the values sorted); the mask gather carries the proof to the lanes it
selects. A proof belongs to one tensor and its views (one storage, one version counter): any in-place write to
any of them since the note voids it, and a view that reaches lanes outside the proven ones is not covered.
"""
from __future__ import annotations

import weakref

import torch

ALL, ODD = "all", "odd"    # which elements of the storage are proven: every one, or the odd flat positions
_MAX_PROOFS = 64           # live proofs kept (a recorded run needs a few; dead ones are dropped first)

_proofs: dict[int, tuple] = {}   # id(root tensor) -> (weakref to it, its version when noted, bound, lanes)


def _root(t: torch.Tensor) -> torch.Tensor:
    return t if t._base is None else t._base


def note(t: torch.Tensor, bound: int, lanes: str) -> None:
    """Every `lanes` element of `t`'s storage (which `t`, a fresh tensor or a view of one, must cover) is an integer
    in 0..bound-1 as read in t's dtype."""
    root = _root(t)
    if (t.dtype.is_floating_point and lanes == ALL) or root.is_inference() \
            or root.untyped_storage().nbytes() != root.nbytes:
        return      # (inference tensors keep no version counter)
    if len(_proofs) >= _MAX_PROOFS:
        for key in [k for k, (ref, *_) in _proofs.items() if ref() is None]:
            del _proofs[key]
        if len(_proofs) >= _MAX_PROOFS:
            _proofs.clear()
    _proofs[id(root)] = (weakref.ref(root), root._version, bound, lanes, root.element_size())


def bound_of(t: torch.Tensor, first: int = 0, step: int = 1) -> int | None:
    """The bound B when every element of `t[..., first::step]` is proven to lie in 0..B-1 (read in t's dtype for
    ALL lanes, as the same-width integer bits for ODD ones), else None."""
    root = _root(t)
    proof = _proofs.get(id(root))
    if proof is None or proof[0]() is not root or t._version != proof[1] or t.element_size() != proof[4]:
        return None
    bound, lanes = proof[2], proof[3]
    if lanes == ALL:
        return bound if t.dtype == root.dtype else None
    strides = t.stride()
    if not strides:
        return bound if t.storage_offset() % 2 else None
    outer = all(s % 2 == 0 for s, n in zip(strides[:-1], t.shape[:-1]) if n > 1)
    last = strides[-1]
    odd = (t.storage_offset() + first * last) % 2 == 1 and (step * last % 2 == 0 or t.shape[-1] <= first + step)
    return bound if outer and odd else None
