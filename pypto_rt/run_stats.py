"""What one entry call did, as typed records: its replay decision and its engine figures. Imports nothing.

The layers that run a call note what happened here (`note_replay`, `note_engine`); whoever asked for a report
(`collect()`: `Runtime.run`, a serving loop, tests) reads it afterwards instead of parsing PYPTO_STATS's stderr.
Collection is scoped with a `contextvars.ContextVar`, so concurrent calls on other threads keep their own.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

# ReplayDecision.kind values (what ran the call, or why no replay)
REPLAYED = "replayed"          # the recorded torch calls ran
RECORDED = "recorded"          # this call ran on the engine and was recorded; later calls may replay
ENGINE = "engine"              # ran on the engine (before recording, a trial turn, or replay not worthwhile)
GUARD_MISS = "guard_miss"      # a replay's guards failed (the data takes another course): the engine ran it
REFUSED = "refused"            # the recording was refused (reason says what made the run unreplayable)
DISABLED = "disabled"          # replay is off (PYPTO_REPLAY=0, PYPTO_TRACE, PYPTO_CHECK, or not applicable)
KINDS = (REPLAYED, RECORDED, ENGINE, GUARD_MISS, REFUSED, DISABLED)


@dataclass(frozen=True)
class ReplayDecision:
    """How one call ran with respect to replay: `kind` (one of KINDS) and a one-sentence `reason`."""
    kind: str
    reason: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown replay decision kind {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}" if self.reason else self.kind


@dataclass
class RunStats:
    """One entry call: `kernel` name, `replay` decision (None: replay not involved, e.g. the reference executor),
    and the engine's figures when the engine ran it (`engine`: tasks, dummy_tasks, edges, ring_high_water,
    ring_size, workers, orchestration_ns, kernel_ns, idle_while_ready_ns, wall_ns, host_reads; None for a replay), and
    `wall_ns`, the whole call as `Runtime.run` timed it (0 where nothing timed it)."""
    kernel: str = ""
    replay: ReplayDecision | None = None
    engine: dict | None = None
    wall_ns: int = 0

    @property
    def tasks(self) -> int:
        return self.engine["tasks"] if self.engine else 0

    @property
    def edges(self) -> int:
        return sum(self.engine["edges"].values()) if self.engine else 0

    @property
    def host_reads(self) -> int:
        """Elements of data the host program read (0 for a replay: it reads what it needs itself, see replay)."""
        return self.engine.get("host_reads", 0) if self.engine else 0


_current: contextvars.ContextVar[RunStats | None] = contextvars.ContextVar("pypto_rt_run_stats", default=None)


@contextlib.contextmanager
def collect(kernel: str = ""):
    """Collect the stats of the calls made inside the block into the yielded RunStats (the last call wins for
    `replay` and `engine`)."""
    stats = RunStats(kernel=kernel)
    token = _current.set(stats)
    try:
        yield stats
    finally:
        _current.reset(token)


def note_replay(kernel: str, decision: ReplayDecision) -> None:
    stats = _current.get()
    if stats is not None:
        stats.kernel = stats.kernel or kernel
        stats.replay = decision


def note_engine(kernel: str, engine_stats: dict) -> None:
    stats = _current.get()
    if stats is not None:
        stats.kernel = stats.kernel or kernel
        stats.engine = dict(engine_stats)
