"""The tensor map: which unfinished tasks read or write which bytes, and the edges a new access needs.

Single-threaded: only the orchestrator (host) thread calls it. Entries of finished tasks are dead: they never
produce edges, are dropped when a lookup meets them, and are swept when an index doubles in size, so the map
holds roughly the tasks still in flight. Imports nothing from pypto_rt.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from .regions import MemoryRegion, box_digits, digits_overlap, overlaps
from .task import FINISHED, Task

_MODES = ("r", "w", "rw")
_RANK = {"RAW": 0, "WAW": 1, "WAR": 2}  # one edge per producer: the strongest kind wins


@dataclass(frozen=True, slots=True)
class TaskAccess:
    """One tensor argument of a task: a region and how the task uses it ("r" In, "w" Out, "rw" InOut).
    (The compiler's per-parameter boxes, before they are bound to tensors, are incore_compiler's ParamAccess.)"""
    region: MemoryRegion
    mode: str

    def __post_init__(self):
        if self.mode not in _MODES:
            raise ValueError(f"access mode {self.mode!r} is not one of {_MODES}")


class _Index:
    """Entries (first byte, end byte, region, task, box_digits) of one storage, sorted by first byte.

    Invariant: every entry spans at most `reach` bytes, so the entries meeting [lo, hi) are among those whose
    first byte lies in (lo - reach, hi) -- one bisect each way instead of a scan.
    """
    __slots__ = ("starts", "entries", "reach", "sweep_at")

    def __init__(self):
        self.starts: list[int] = []
        self.entries: list[tuple] = []
        self.reach = 0
        self.sweep_at = 64

    def add(self, region: MemoryRegion, task: Task) -> None:
        if len(self.entries) >= self.sweep_at:
            self._sweep()
        i = bisect_right(self.starts, region.lo)
        self.starts.insert(i, region.lo)
        self.entries.insert(i, (region.lo, region.hi, region, task, box_digits(region)))
        self.reach = max(self.reach, region.hi - region.lo)

    def meeting(self, region: MemoryRegion) -> list[Task]:
        """Unfinished tasks of entries sharing bytes with `region`; drops the finished ones it meets."""
        lo, hi = region.lo, region.hi
        i = bisect_right(self.starts, lo - self.reach)
        j = bisect_left(self.starts, hi, i)
        met, dead, digits = [], [], False
        for k in range(i, j):
            entry = self.entries[k]
            if entry[1] <= lo:
                continue
            if entry[3].state in FINISHED:
                dead.append(k)
                continue
            if digits is False:
                digits = box_digits(region)
            if digits is not None and entry[4] is not None and digits[0] == entry[4][0]:
                shared = digits_overlap(digits, entry[4])
            else:
                shared = overlaps(region, entry[2])
            if shared:
                met.append(entry[3])
        for k in reversed(dead):
            del self.starts[k], self.entries[k]
        return met

    def remove_task(self, task: Task) -> None:
        self.entries = [e for e in self.entries if e[3] is not task]
        self.starts = [e[0] for e in self.entries]

    def _sweep(self) -> None:
        self.entries = [e for e in self.entries if e[3].state not in FINISHED]
        self.starts = [e[0] for e in self.entries]
        self.reach = max((e[1] - e[0] for e in self.entries), default=0)
        self.sweep_at = max(64, 2 * len(self.entries))


class TensorMap:
    """storage key -> entries of unfinished tasks, writers ("w"/"rw") and pure readers in separate indexes, so
    a read looks only at writers."""

    def __init__(self):
        self._writers: dict[int, _Index] = {}
        self._readers: dict[int, _Index] = {}

    def edges_for(self, accesses) -> list[tuple[Task, str]]:
        """The producers a task with these accesses must wait for, one (task, kind) per producer.

        A read waits for overlapping writers (RAW); a write waits for overlapping writers (WAW) and readers (WAR:
        workers run in parallel and views alias, so unlike the device runtime we must track it).
        """
        found: dict[Task, str] = {}

        def note(tasks, kind):
            for task in tasks:
                if task not in found or _RANK[kind] < _RANK[found[task]]:
                    found[task] = kind

        for access in accesses:
            region = access.region
            if region.lo == region.hi:
                continue
            writers = self._writers.get(region.key)
            if writers is not None:
                note(writers.meeting(region), "WAW" if access.mode == "w" else "RAW")
            if access.mode != "r":
                readers = self._readers.get(region.key)
                if readers is not None:
                    note(readers.meeting(region), "WAR")
        return list(found.items())

    def insert(self, task: Task, accesses) -> None:
        """Record task's accesses; a task touching the same region twice keeps one entry (a writing one if any)."""
        if len(accesses) == 1:  # the common case needs no de-duplication (and no MemoryRegion hashing)
            merged = ((accesses[0].region, accesses[0].mode != "r"),)
        else:
            seen: dict[MemoryRegion, bool] = {}
            for access in accesses:
                seen[access.region] = seen.get(access.region, False) or access.mode != "r"
            merged = seen.items()
        for region, writes in merged:
            if region.lo == region.hi:
                continue
            indexes = self._writers if writes else self._readers
            index = indexes.get(region.key)
            if index is None:
                index = indexes[region.key] = _Index()
            index.add(region, task)

    def retire(self, task: Task) -> None:
        """Drop task's entries now (finished tasks are also retired lazily, on lookup and by sweeps)."""
        for key in {a.region.key for a in task.accesses}:
            for indexes in (self._writers, self._readers):
                if key in indexes:
                    indexes[key].remove_task(task)

    def in_flight(self, region: MemoryRegion, for_write: bool) -> list[Task]:
        """Unfinished tasks writing bytes of `region`, and reading them too when `for_write` (a host wait)."""
        if region.lo == region.hi:
            return []
        found: dict[Task, None] = {}
        for indexes in (self._writers, self._readers) if for_write else (self._writers,):
            if region.key in indexes:
                found.update(dict.fromkeys(indexes[region.key].meeting(region)))
        return list(found)
