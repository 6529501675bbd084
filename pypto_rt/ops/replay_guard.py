"""Ops that must run every time declare it here: a recorded run (orchestration.torch_trace) is then not replayed.

Replaying a recorded run repeats its torch calls only; an op whose effect lies outside them (communication with
other ranks, printing) calls `refuse(reason)`. Costs one list check when nothing records.
"""
from __future__ import annotations

_refusers: list = []   # the recorders active on the recording thread (one run records at a time)


def push(refuser) -> None:
    _refusers.append(refuser)


def pop() -> None:
    _refusers.pop()


def refuse(reason: str) -> None:
    """The run now being recorded, if any, must not be replayed: `reason` says why."""
    if _refusers:
        _refusers[-1](reason)


def recording() -> bool:
    return bool(_refusers)
