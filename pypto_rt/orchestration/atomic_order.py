"""PYPTO_DETERMINISTIC=1: tasks adding atomically into the same bytes run one after another, in program order.

Outside manual scopes the tensor map already orders them (an atomic add reads its target: RAW edges); inside one,
and for targets passed as `no_dep`, nothing else would. The host asks `follow(regions)` for the unfinished earlier
tasks a new task must follow (the engine wires them as "atomic_order" edges), then `note`s the new task. An entry
whose region a later task adds into again exactly is dropped: whoever meets that region meets the later task,
which follows it; so a split-K loop makes one edge per task rather than one per pair. Host thread only.
"""
from __future__ import annotations

from pypto_rt.aicpu import MemoryRegion, Task, overlaps
from pypto_rt.aicpu.task import FINISHED


class AtomicOrder:
    def __init__(self):
        self._entries: dict[int, list[tuple[MemoryRegion, Task]]] = {}   # storage key -> (region, task), program order

    def follow(self, regions) -> list[Task]:
        """The unfinished earlier tasks adding into bytes of `regions`."""
        found: dict[Task, None] = {}
        for region in regions:
            entries = self._entries.get(region.key)
            if entries:
                entries[:] = [(r, t) for r, t in entries if t.state not in FINISHED]
                found.update((t, None) for r, t in entries if overlaps(r, region))
        return list(found)

    def note(self, task: Task, regions) -> None:
        """`task` adds into `regions` (after every task `follow` gave for them)."""
        for region in regions:
            entries = self._entries.setdefault(region.key, [])
            entries[:] = [(r, t) for r, t in entries if r != region]
            entries.append((region, task))
