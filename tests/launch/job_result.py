"""What a launched job left: exit code, output, time (shared by the launcher and multi-rank tests)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Job:
    rc: int
    out: str
    err: str
    seconds: float
