"""The engine's errors and the reports they carry. Imports only pypto_rt.errors from pypto_rt."""
from __future__ import annotations

from pypto_rt.errors import PyptoError

from .task import Task

_REPORTED_TASKS = 5


class TaskFailedError(PyptoError):
    """A kernel raised. `.task` is the first task that failed; `__cause__` is the kernel's own exception."""

    def __init__(self, task: Task):
        cause = task.error
        text = cause.message if isinstance(cause, PyptoError) else f"{type(cause).__name__}: {cause}"
        span = cause.span if isinstance(cause, PyptoError) and cause.span is not None else task.span
        super().__init__(f"task {task.label} failed: {text}", span)
        self.task = task
        self.error = cause          # also kept where `raise ... from None` drops __cause__ (wait reports read it)
        self.__cause__ = cause


class TaskPoisoned(PyptoError):
    """Stored as `.error` of a task that never ran because `producer` failed (or, dropped, because the run did)."""

    def __init__(self, task: Task, producer: Task | None, dropped: bool = False):
        if not dropped:
            why = f"its producer {producer.label} failed"
        elif producer is not None:
            why = f"the run stopped after task {producer.label} failed"
        else:
            why = "the run was closed before it started"
        super().__init__(f"task {task.label} did not run: {why}", task.span)
        self.producer = producer


class StallError(PyptoError):
    """No task started or finished for timeout_s while work was outstanding."""


class RingOverflowError(PyptoError):
    """Every task-ring slot is held by a task of a scope that is still open: submit could never go on."""


def stall_error(run: str, live: list[Task], idle_s: float, now_ns: int) -> StallError:
    """The watchdog's report: counts by state, then up to five stuck tasks (running first)."""
    counts = {state: sum(t.state == state for t in live) for state in ("running", "ready", "waiting")}
    lines = [f"run '{run}' made no progress for {idle_s:.1f} s: " +
             ", ".join(f"{n} {state}" for state, n in counts.items())]
    order = {"running": 0, "ready": 1, "waiting": 2}
    stuck = sorted((t for t in live if t.state in order), key=lambda t: (order[t.state], t.id))[:_REPORTED_TASKS]
    for t in stuck:
        where = f" at {t.span}" if t.span is not None else ""
        line = f"  task {t.label}{where}: {t.state}"
        if t.state == "running":
            line += f" for {(now_ns - t.t_start) / 1e9:.1f} s"
        elif t.state == "waiting":
            line += " for " + ", ".join(f"{p.label} ({p.state})" for p in t.deps_waiting)
        lines.append(line)
    return StallError("\n".join(lines), stuck[0].span if stuck else None,
                      hint="a kernel that never returns (or waits on something outside the run) stalls it; "
                           "raise PYPTO_TIMEOUT_S if the tasks are legitimately this slow")


def ring_overflow_error(scopes: list, ring_size: int) -> RingOverflowError:
    """Names the open scope holding the most slots (innermost on ties) and lists the others."""
    holders = [s for s in reversed(scopes) if s.tasks]
    worst = max(holders, key=lambda s: len(s.tasks))
    lines = [f"the task ring is full ({ring_size} slots) and cannot drain: scope '{worst.name}'"
             f"{f' at {worst.span}' if worst.span else ''} holds {len(worst.tasks)} tasks until it closes"]
    lines += [f"  scope '{s.name}' holds {len(s.tasks)}" for s in holders if s is not worst]
    return RingOverflowError("\n".join(lines), worst.span,
                             hint=f"raise PYPTO_RING_SIZE (now {ring_size}) or open a `pl.scope()` per loop body "
                                  "so each iteration's tasks are released when it ends")
