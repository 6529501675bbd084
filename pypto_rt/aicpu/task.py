"""One submitted kernel dispatch: a node of the task graph. Imports nothing from pypto_rt.

State machine: waiting -> ready -> running -> done | failed. A task also becomes failed without running when a
producer failed (poisoned) or when the run failed before it started (dropped). Only the engine changes a task,
under its lock, except that a worker marks `running` / `t_start` / `lane` when it starts a block.
"""
from __future__ import annotations

FINISHED = frozenset(("done", "failed"))


class Task:
    """A DAG node; the TaskId handed to users is the Task itself.

    `run(block)` executes one block (None: a dummy task that only joins its deps); `blocks` blocks run, possibly
    concurrently on different workers, and the task is done when all are. `result` is block 0's return value.
    `deps` lists (producer, kind) for every edge wired at submit (kind RAW/WAW/WAR/dep); `consumers` are the tasks
    waiting on this one (emptied once it finishes); `pending` counts producers not yet finished. Timestamps are
    perf_counter_ns (0 = not yet).
    `slices` holds one (block, lane, start_ns, end_ns) per block that ran.
    """
    __slots__ = ("id", "name", "span", "run", "blocks", "accesses", "state", "error", "result", "deps",
                 "consumers", "pending", "blocks_left", "refs", "slices", "lane",
                 "t_submit", "t_ready", "t_start", "t_end")

    def __init__(self, id: int, name: str, run, blocks: int, accesses, span, t_submit: int):
        self.id = id
        self.name = name
        self.span = span
        self.run = run
        self.blocks = blocks
        self.accesses = accesses
        self.state = "waiting"
        self.error: BaseException | None = None
        self.result = None
        self.deps: list = []
        self.consumers: list[Task] = []
        self.pending = 0
        self.blocks_left = blocks
        self.refs = 2  # ring slot references: one released on finishing, one when its scope closes
        self.slices: list = []
        self.lane = -1
        self.t_submit = t_submit
        self.t_ready = 0
        self.t_start = 0
        self.t_end = 0

    @property
    def deps_waiting(self) -> list[Task]:
        """Producers this task still waits for (for stall reports)."""
        return [p for p, _ in self.deps if p.state not in FINISHED]

    @property
    def label(self) -> str:
        return f"'{self.name}' (#{self.id})"

    def __repr__(self) -> str:
        return f"<Task {self.label} {self.state}>"
