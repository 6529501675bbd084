"""How long a futex-backed shm wait polls (yielding) before it blocks, when PYPTO_SHM_POLL_US is unset (the default).

Why poll at all: on a virtual machine whose idle vCPU halts, a waiter blocked on a futex wakes 0.4-1 ms after the
peer's signal, so two ranks that signal each other ping-pong on that latency (a 2-rank decode MoE call: 2.2-3.7 ms
wall for ~1.1 ms of CPU). Why not always: a poller keeps its core, so where other jobs want the cores it takes the
share of the very peer it waits for (measured 5.0-5.8 against 3.3 ms a call under load).

`PollPolicy.budget(site)` decides, per wait, from two things it measured:
- the host: polling is allowed only while the job's ranks each have a core. Every `SAMPLE_EVERY_S` it reads how
  many tasks the kernel has runnable right now (/proc/loadavg's 4th field, the reader included) and keeps a moving
  share of samples with more runnable tasks than usable cores; past `CROWDED_SHARE` it does not poll (a 1-minute
  load average over the cores stops it too). Without /proc, no polls: the futex path as before.
- the wait site (a window cell, a barrier): the last `HISTORY` waits' durations. A site whose waits usually end
  within X polls up to 2X (at least `MIN_POLL_S`); a site whose median X is over `MAX_POLL_S / 2` blocks at once.
  A blocked wait's duration includes the wake-up latency, so a site that blocks because its waits were late comes
  back to polling once they are not (its median falls under MAX_POLL_S / 2 again).
Every decision is bounded: at most MAX_POLL_S of polls per wait, and none on a crowded host.
"""
from __future__ import annotations

import os
import time
from collections import deque

MAX_POLL_S = 3e-3         # the most a wait polls (the futex wake-up latency it saves is 0.4-1 ms)
MIN_POLL_S = 100e-6       # a site that polls polls at least this long (its median may be a few microseconds)
HISTORY = 8               # waits remembered per site
SAMPLE_EVERY_S = 0.02     # how often the host's runnable count is read (a read costs ~2 us)
CROWDED_SHARE = 0.25      # past this moving share of crowded samples, no polls
SAMPLE_WEIGHT = 0.25      # weight of the newest sample in the moving share
LOADAVG = "/proc/loadavg"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LoadReader:
    """Reads (1-minute load average, runnable tasks now) from /proc/loadavg through one kept descriptor; None
    where there is none (then nothing polls)."""

    def __init__(self, path: str = LOADAVG):
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> tuple[float, int] | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return float(fields[0]), int(fields[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PollPolicy:
    """Per-wait poll budgets for one communicator's ranks on this host (see the module text). `read_load()` returns
    (load1, runnable now) or None; `clock` is injectable for tests."""

    def __init__(self, ranks: int, cores: int | None = None, read_load=None, clock=time.monotonic):
        self.ranks = ranks
        self.cores = usable_cores() if cores is None else cores
        self._read_load = LoadReader() if read_load is None else read_load
        self._clock = clock
        self._sites: dict[object, deque] = {}
        self._next_sample = 0.0
        self._crowded = 1.0 if ranks > self.cores else None   # None: no sample yet

    # ------------------------------------------------------------------------------------------ the host
    def _sample(self) -> None:
        load = self._read_load()
        if load is None:
            self._crowded = 1.0
            return
        load1, runnable = load
        crowded = 1.0 if runnable > self.cores or load1 > self.cores + 1 else 0.0
        self._crowded = crowded if self._crowded is None else (
            (1 - SAMPLE_WEIGHT) * self._crowded + SAMPLE_WEIGHT * crowded)

    def host_allows(self) -> bool:
        """True while the job's ranks each have a core, by the recent samples (read at most every SAMPLE_EVERY_S)."""
        if self.ranks > self.cores:
            return False
        now = self._clock()
        if now >= self._next_sample:
            self._next_sample = now + SAMPLE_EVERY_S
            self._sample()
        return self._crowded <= CROWDED_SHARE

    # ------------------------------------------------------------------------------------------ the sites
    def site_budget(self, site) -> float:
        """Seconds a wait at `site` polls from what its recent waits took: MAX_POLL_S for a site not seen yet."""
        history = self._sites.get(site)
        if not history:
            return MAX_POLL_S
        typical = sorted(history)[len(history) // 2]
        if typical > MAX_POLL_S / 2:
            return 0.0
        return max(2 * typical, MIN_POLL_S)

    def budget(self, site) -> float:
        """Seconds a wait at `site` polls (yielding) before it blocks: 0.0 on a crowded host."""
        return self.site_budget(site) if self.host_allows() else 0.0

    def record(self, site, waited_s: float) -> None:
        """A wait at `site` ended after `waited_s` seconds (from its start, polls and block included)."""
        history = self._sites.get(site)
        if history is None:
            history = self._sites[site] = deque(maxlen=HISTORY)
        history.append(waited_s)

    def close(self) -> None:
        closer = getattr(self._read_load, "close", None)
        if closer is not None:
            closer()
