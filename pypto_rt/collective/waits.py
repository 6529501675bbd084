"""Waiting with backoff and a deadline, the wait records a timeout carries, and the cross-rank picture they make.

Every blocking wait of a communicator goes through `backoff_wait`: a short spin, then `sched_yield` polls, then
sleeps doubling up to `MAX_SLEEP_S` (8 ranks may share 2 cores), until the condition holds or the deadline passes;
given a `block` (the shm communicator's futex on the awaited cell), it blocks there instead of sleeping, so it
wakes when the peer signals (a doubling sleep overshoots the signal by up to MAX_SLEEP_S).
A wait that expires becomes a `CommTimeoutError` whose `.wait` dict has exactly `WAIT_KEYS`; the launcher collects
those dicts from all ranks and `merge_reports` renders them as one wait-for picture naming the root. Imports
nothing from pypto_rt but this package's base.
"""
from __future__ import annotations

import os
import time

from .base import CommTimeoutError

WAIT_KEYS = ("rank", "op", "label", "window", "cell", "seen", "expected", "cmp", "peers", "waited_s")

SPIN_POLLS = 200          # busy polls first: a peer on the other core answers within microseconds
YIELD_POLLS = 100         # then give the core to a peer that shares it
MIN_SLEEP_S = 50e-6       # then sleep, doubling (a sleep shorter than ~60 µs is not honoured anyway)
MAX_SLEEP_S = 1e-3
WATCH_EVERY_S = 0.05      # how often a sleeping wait runs its `watch` callback (peer liveness)

_CMP_TEXT = {"eq": "==", "ge": ">=", None: ""}

_clock = time.monotonic


def backoff_wait(ready, timeout_s: float, watch=None, spin: int = SPIN_POLLS, yields: int = YIELD_POLLS,
                 max_sleep: float = MAX_SLEEP_S, block=None, poll_s=0.0) -> float | None:
    """Poll `ready()` until true; returns the seconds waited, or None when `timeout_s` passed first.
    `watch()` runs every WATCH_EVERY_S once the wait sleeps; it raises to end the wait early. Costly polls (a
    store round trip) pass fewer spins and a longer max_sleep. `block(seconds)` (optional) returns when what
    `ready` reads may have changed or the seconds passed; it replaces the sleeps (the yields stay: a peer that
    answers within them costs no system call, and this rank stays runnable); `poll_s` (seconds, or a callable
    returning them, asked only when the yields did not do) keeps yielding that long from the wait's start before
    the block (a blocked waiter may wake long after the signal)."""
    for _ in range(spin):
        if ready():
            return 0.0
    start = _clock()
    deadline = start + timeout_s
    next_watch = start + WATCH_EVERY_S if watch is not None else float("inf")
    for _ in range(yields):
        os.sched_yield()
        if ready():
            return _clock() - start
    if block is not None:
        poll_until = start + min(poll_s() if callable(poll_s) else poll_s, timeout_s)
        while _clock() < poll_until:
            os.sched_yield()
            if ready():
                return _clock() - start
    pause = _sleeps(max_sleep) if block is None else (lambda now, until: block(until - now))
    while True:
        if ready():
            return _clock() - start
        now = _clock()
        if now >= deadline:
            return None
        if watch is not None and now >= next_watch:
            watch()
            next_watch = now + WATCH_EVERY_S
        pause(now, min(deadline, next_watch))


def _sleeps(max_sleep: float):
    """backoff_wait's pause without a block: sleeps doubling from MIN_SLEEP_S to `max_sleep`, none past `until`."""
    sleep = MIN_SLEEP_S

    def pause(now: float, until: float) -> None:
        nonlocal sleep
        time.sleep(min(sleep, max(until - now, 0.0)))
        sleep = min(sleep * 2, max_sleep)
    return pause


def wait_record(rank: int, op: str, label: str | None = None, window: str | None = None, cell=None, seen=None,
                expected=None, cmp: str | None = None, peers=None, waited_s: float = 0.0) -> dict:
    """A wait record: what `rank` waited for in `op`. `cell`/`peers` are lists or None; `seen` is one value or
    (barriers, rendezvous) one value per entry of `peers`."""
    return {"rank": rank, "op": op, "label": label, "window": window,
            "cell": None if cell is None else [int(c) for c in cell], "seen": seen, "expected": expected,
            "cmp": cmp, "peers": None if peers is None else sorted(int(p) for p in peers),
            "waited_s": round(float(waited_s), 3)}


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def describe(w: dict) -> str:
    """One line: who waits where, for what, seen vs expected, for how long."""
    text = f"rank {w['rank']} waits in `{w['op']}`"
    if w.get("label"):
        text += f" (label {w['label']})"
    cmp = _CMP_TEXT.get(w.get("cmp"), w.get("cmp"))
    values = (f"seen {w['seen']}, expected {cmp + ' ' if cmp else ''}{w['expected']}"
              if w.get("expected") is not None else None)
    peers = w.get("peers")
    if w.get("window") is not None:
        cell = f"cell {w['cell']} of " if w.get("cell") is not None else ""
        text += f" for {cell}window '{w['window']}'"
        text += f" ({values})" if values else ""
        text += f", which {_ranks(peers)} would set" if peers else ""
    elif peers:
        text += f" for {_ranks(peers)}" + (f" ({values})" if values else "")
    elif values:
        text += f" ({values})"
    return text + f" for {w.get('waited_s', 0.0):.1f} s"


def timeout_error(w: dict, hint: str | None = None) -> CommTimeoutError:
    return CommTimeoutError(f"timed out: {describe(w)}", hint=hint or (
        "PYPTO_TIMEOUT_S bounds every wait: a wait nobody satisfies means a missing notify, a wrong peer or "
        "offset, Eq where peers run ahead (use Ge), or ranks calling collectives in different orders "
        "(PYPTO_COMM_CHECK=1 finds those); raise PYPTO_TIMEOUT_S only if the peers are legitimately this slow"),
        wait=w)


# ---------------------------------------------------------------------------------------------------- merging

def _reach(start: int, edges: dict[int, list[int]]) -> set[int]:
    seen, todo = set(), list(edges.get(start, ()))
    while todo:
        r = todo.pop()
        if r not in seen:
            seen.add(r)
            todo.extend(edges.get(r, ()))
    return seen


def _roots(reports: dict[int, dict]) -> list[str]:
    """Sinks of the wait-for graph: ranks waiting on nobody (or sending no report) and cycles nobody leaves."""
    edges = {r: [p for p in w["peers"] if p != r] for r, w in reports.items() if w.get("peers") is not None}
    nodes = set(reports) | {p for ps in edges.values() for p in ps}
    lines, done = [], set()
    for r in sorted(nodes):
        if r in done:
            continue
        if r not in reports:
            waiters = sorted(q for q in reports if r in _reach(q, edges))
            lines.append(f"rank {r} sent no report: it is not waiting in a communicator op (busy, finished or "
                         f"dead) and {_ranks(waiters)} {'waits' if len(waiters) == 1 else 'wait'} on it")
            done.add(r)
        elif r not in edges:
            lines.append(f"rank {r} does not know which rank would satisfy its wait (pass peers= to wait)")
            done.add(r)
        elif not edges[r]:
            lines.append(f"rank {r} waits on no other rank")
            done.add(r)
        else:
            reach = _reach(r, edges)
            if r in reach and all(r in _reach(q, edges) for q in reach):   # a sink cycle
                cycle = sorted(reach)
                chain = " -> ".join(f"rank {q}" for q in cycle + [cycle[0]]) if len(cycle) > 1 else f"rank {r}"
                lines.append(f"cycle {chain}: each waits on the next (notify/wait that do not match, or "
                             f"collectives called in a different order)")
                done.update(cycle)
    return lines


def merge_reports(reports, world_size: int | None = None) -> str:
    """Render wait records of many ranks as one wait-for picture and name its root(s). Deterministic."""
    by_rank: dict[int, dict] = {}
    for w in reports:
        if w is not None:
            by_rank[int(w["rank"])] = w
    if not by_rank:
        return "no rank reported a wait"
    missing = sorted(set(range(world_size)) - set(by_rank)) if world_size else []
    lines = [f"cross-rank wait-for picture ({len(by_rank)} rank{'s' if len(by_rank) != 1 else ''} waiting"
             + (f", {_ranks(missing)} not" if missing else "") + "):"]
    lines += [f"  {describe(by_rank[r])}" for r in sorted(by_rank)]
    roots = _roots(by_rank)
    lines.append("root:" if len(roots) == 1 else "roots:")
    lines += [f"  {line}" for line in roots]
    return "\n".join(lines)
