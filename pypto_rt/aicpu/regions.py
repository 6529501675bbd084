"""Byte regions of tensor storage and an exact overlap test.

A `MemoryRegion` is a strided box of one storage buffer measured in bytes: the element at box index i lives at
`offset + sum(i[d] * strides[d])` and spans `itemsize` bytes. Two accesses race exactly when their regions share
a byte, so `overlaps` never answers False for shared bytes; it answers True without sharing only when an exact
answer would be too costly (more than `MAX_RUNS` contiguous runs on a side).

Imports nothing from pypto_rt.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

MAX_RUNS = 65536  # above this many contiguous byte runs per side, `overlaps` gives the conservative True


class MemoryRegion(namedtuple("_MemoryRegionFields", "key offset shape strides itemsize lo hi")):
    """A strided box of one buffer, in bytes (immutable).

    `key` is the storage identity (its data pointer), `offset` the byte offset of the box's first element,
    `shape` the box extent in elements, `strides` byte strides (>= 0, as torch views have), `itemsize` the
    bytes of one element (the contract's four fields plus this one: without it the last element's bytes are
    unknown, and a bf16 box could not be compared with the same bytes seen as float32).
    `lo`/`hi` (derived) bound the touched bytes as [lo, hi); lo == hi means the box is empty.
    A named tuple rather than a frozen dataclass: one is made per access of every submitted task, and this
    builds in a third of the time.
    """
    __slots__ = ()

    def __new__(cls, key: int, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int = 1):
        hi = offset
        if 0 not in shape:
            hi += itemsize
            for n, st in zip(shape, strides):
                hi += (n - 1) * st
        return tuple.__new__(cls, (key, offset, shape, strides, itemsize, offset, hi))

    def __repr__(self) -> str:
        return (f"MemoryRegion(key={self.key}, offset={self.offset}, shape={self.shape}, strides={self.strides}, "
                f"itemsize={self.itemsize})")


def region_of(t, offsets=None, sizes=None) -> MemoryRegion:
    """The box t[offsets[d] : offsets[d] + sizes[d]] of view `t` (None, a None entry, or an entry past the end
    of a shorter list = the whole dim / to the end).

    Offsets and sizes are clamped to t's extent, so a box past the end is empty (and overlaps nothing).
    """
    esize = t.element_size()
    strides = tuple(s * esize for s in t.stride())
    offset = t.storage_offset() * esize
    shape = tuple(t.shape)
    if offsets is not None or sizes is not None:
        box = []
        n_off = len(offsets) if offsets is not None else 0
        n_size = len(sizes) if sizes is not None else 0
        for d, extent in enumerate(shape):
            start = int(offsets[d]) if d < n_off and offsets[d] is not None else 0
            start = 0 if start < 0 else extent if start > extent else start
            size = int(sizes[d]) if d < n_size and sizes[d] is not None else extent - start
            box.append(0 if size < 0 else min(size, extent - start))
            offset += start * strides[d]
        shape = tuple(box)
    return MemoryRegion(t.untyped_storage().data_ptr(), offset, shape, strides, esize)


def overlaps(a: MemoryRegion, b: MemoryRegion) -> bool:
    """True when a and b share a byte (exact up to the MAX_RUNS cut-off, where it is conservatively True)."""
    if a.key != b.key or a.lo >= b.hi or b.lo >= a.hi or a.lo == a.hi or b.lo == b.hi:
        return False
    exact = _digits_overlap(a, b, _layout_plan(a, b))
    if exact is None:
        exact = _digits_overlap(a, b, _shape_plan(a, b))
    return exact if exact is not None else _runs_overlap(a, b)


def _digits_overlap(a: MemoryRegion, b: MemoryRegion, plan: tuple | None) -> bool | None:
    """Exact test over a digit plan; None without a plan or when an offset's digits carry.

    A plan lists dims as (stride, dim in a, dim in b) with strides s1 > s2 > ... > sk, each dividing the
    previous. Then an address has unique mixed-radix digits (digit d < s[d-1]/s[d] for d > 1) plus a remainder
    below sk. A box whose offset digits do not carry (digit + size <= radix in every dim but the first) is the
    product of one digit interval per dim, so two such boxes intersect iff their remainders match and every
    dim's intervals intersect.
    """
    if plan is None:
        return None
    oa, ob = a.offset, b.offset
    disjoint, outer = False, 0
    for s, da, db in plan:
        ca, oa = divmod(oa, s)
        cb, ob = divmod(ob, s)
        na = 1 if da is None else a.shape[da] if da >= 0 else a.itemsize   # dim -1: the element bytes
        nb = 1 if db is None else b.shape[db] if db >= 0 else b.itemsize
        if outer and (ca + na > outer // s or cb + nb > outer // s):
            return None
        if ca >= cb + nb or cb >= ca + na:
            disjoint = True  # keep checking the other dims for carries: a carry voids this answer
        outer = s
    return not disjoint and oa == ob


def box_digits(r: MemoryRegion) -> tuple | None:
    """(layout, remainder, digit intervals) of a non-empty box under its own layout's plan, or None (no chain,
    or a carry). Computed once per tensor-map entry, it turns each later same-layout test into integer
    comparisons (`digits_overlap`)."""
    plan = _layout_plan(r, r)
    if plan is None:
        return None
    o, outer, intervals = r.offset, 0, []
    for s, d, _ in plan:
        c, o = divmod(o, s)
        n = r.shape[d] if d >= 0 else r.itemsize
        if outer and c + n > outer // s:
            return None
        intervals.append((c, c + n))
        outer = s
    return (r.strides, r.itemsize), o, tuple(intervals)


def digits_overlap(a: tuple, b: tuple) -> bool:
    """`overlaps` for two `box_digits` of the same layout (the caller checks a[0] == b[0])."""
    if a[1] != b[1]:
        return False
    for (a0, a1), (b0, b1) in zip(a[2], b[2]):
        if a0 >= b1 or b0 >= a1:
            return False
    return True


_layout_plans: dict[tuple, tuple | None] = {}
_MAX_LAYOUT_PLANS = 4096


def _layout_plan(a: MemoryRegion, b: MemoryRegion) -> tuple | None:
    """The plan over every dim with a non-zero stride, whatever its size, so it depends only on the cache key:
    one per pair of layouts (the common case: tiles of the same few views). Size-1 dims only add digits, but
    their strides may break the chain or carry."""
    key = (a.strides, a.itemsize, b.strides, b.itemsize)
    plan = _layout_plans.get(key, False)
    if plan is False:
        if len(_layout_plans) >= _MAX_LAYOUT_PLANS:
            _layout_plans.clear()
        plan = _layout_plans[key] = _build_plan(_moving(a, 0), _moving(b, 0))
    return plan


def _shape_plan(a: MemoryRegion, b: MemoryRegion) -> tuple | None:
    """The plan over the dims that move in a or in b (size > 1): exact where the layout plan is not."""
    return _build_plan(_moving(a, 2), _moving(b, 2))


def _moving(r: MemoryRegion, min_size: int) -> list[tuple[int, int]]:
    """(stride, dim) of r's dims with a non-zero stride and at least min_size elements; the element bytes as
    dim -1."""
    dims = [(s, d) for d, (n, s) in enumerate(zip(r.shape, r.strides)) if s > 0 and n >= min_size]
    return dims + [(1, -1)] if r.itemsize > 1 else dims


def _build_plan(dims_a, dims_b) -> tuple | None:
    """Merge two boxes' dims by stride; None when a stride repeats within a box or the strides do not chain."""
    by_stride: dict[int, list] = {}
    for side, dims in ((1, dims_a), (2, dims_b)):
        for s, d in dims:
            slot = by_stride.setdefault(s, [s, None, None])
            if slot[side] is not None:
                return None
            slot[side] = d
    chain = sorted(by_stride, reverse=True)
    if any(outer % inner for outer, inner in zip(chain, chain[1:])):
        return None
    return tuple(tuple(by_stride[s]) for s in chain)


def _runs(r: MemoryRegion) -> tuple[np.ndarray, int] | None:
    """Sorted start bytes of r's contiguous runs and the run length; None when there are over MAX_RUNS."""
    dims = sorted((s, n) for n, s in zip(r.shape, r.strides) if n > 1 and s > 0)
    length = r.itemsize
    while dims and dims[0][0] == length:
        length *= dims.pop(0)[1]
    count = 1
    for _, n in dims:
        count *= n
    if count > MAX_RUNS:
        return None
    starts = np.array([r.offset], dtype=np.int64)
    for s, n in dims:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    starts.sort()
    return starts, length


def _runs_overlap(a: MemoryRegion, b: MemoryRegion) -> bool:
    """Run-list intersection; conservative True when either side has too many runs."""
    ra, rb = _runs(a), _runs(b)
    if ra is None or rb is None:
        return True
    (sa, la), (sb, lb) = ra, rb
    # a run [x, x+lb) of b meets a run of a iff some start of a lies in (x - la, x + lb)
    idx = np.searchsorted(sa, sb - la, side="right")
    inside = idx < len(sa)
    return bool(np.any(sa[idx[inside]] < sb[inside] + lb))


__all__ = ["MAX_RUNS", "MemoryRegion", "box_digits", "digits_overlap", "overlaps", "region_of"]
