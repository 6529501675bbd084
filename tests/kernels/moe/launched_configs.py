"""Several configurations of progs/dispatch_combine.py in one launched job (`--then` between them), each given back
as a Job of its own: a rank's start-up (python, the torch import: ~4 s of CPU each) is most of a small job's cost,
so tests that launch the same program at the same rank count with the same flags share one job.

A configuration's Job holds the job's lines between each rank's "CONFIG i begins" and "CONFIG i ends ..." (the
rank prefix kept), the job's whole stderr and time, and rc 0 exactly when every rank printed "CONFIG i ends ok"
(else the job's non-zero code, or 1). A configuration that crashes a rank leaves the later ones without lines:
their tests fail too, showing the job's output.
"""
from __future__ import annotations

import re

from tests.launch.job_result import Job
from tests.multirank.launched import launch

_MARK = re.compile(r"rank (\d+)/\d+: CONFIG (\d+) (begins|ends ok|ends not ok)$")


class SharedJobs:
    """`job(nproc, prog, flags, configs, index)`: configuration `index` of the job that runs all of `configs` (a
    tuple of argument tuples) at `nproc` ranks with `flags`, launched at the first request and kept."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self._jobs: dict[tuple, list[Job]] = {}

    def job(self, nproc: int, prog: str, flags: tuple, configs: tuple, index: int) -> Job:
        key = (nproc, prog, flags, configs)
        if key not in self._jobs:
            args = [a for i, config in enumerate(configs) for a in (("--then",) if i else ()) + tuple(config)]
            whole = launch(nproc, prog, *flags, args=tuple(args), limit_s=self.limit_s)
            self._jobs[key] = split(whole, nproc, len(configs))
        return self._jobs[key][index]


def split(job: Job, nproc: int, count: int) -> list[Job]:
    """The job's lines per configuration (see the module's text)."""
    lines = [[] for _ in range(count)]
    current = {}   # rank -> the configuration its lines belong to now
    ok = [set() for _ in range(count)]
    for line in job.out.splitlines():
        rank = re.match(r"\[rank (\d+)\] ", line)
        mark = _MARK.search(line)
        if mark:
            r, i, what = int(mark.group(1)), int(mark.group(2)), mark.group(3)
            current[r] = i if what == "begins" else None
            ok[i] |= {r} if what == "ends ok" else set()
        elif rank and current.get(int(rank.group(1))) is not None:
            lines[current[int(rank.group(1))]].append(line)
    return [Job(0 if ok[i] == set(range(nproc)) else (job.rc or 1), "\n".join(lines[i]) + "\n", job.err, job.seconds)
            for i in range(count)]
