"""`python -m bench.profile_tasks [top]`: cProfile of benchmark 1 (1024 tiny tasks, compiled runtime), host thread and
worker threads separately, top functions by tottime.

cProfile sees one thread; the workers are profiled by wrapping `Engine.execute` (the pool's per-block entry) in
a per-thread profiler for the duration of the profiled runs only.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading

import torch

from bench import jit_kernels as k

RUNS = 5


def _top(stats: pstats.Stats, count: int, title: str) -> str:
    stats.sort_stats("tottime")
    buf = io.StringIO()
    stats.stream = buf
    stats.print_stats(count)
    body = buf.getvalue()
    start = body.find("   ncalls")
    return f"### {title}\n\n```\n{body[start:].rstrip()}\n```"


def profile(count: int = 10) -> str:
    from pypto_rt import config
    from pypto_rt.aicpu import engine as engine_module

    x = torch.randn(k.TILE * k.N_TILES, k.TILE)
    y = torch.empty_like(x)
    with config.scope(EXECUTOR="compiled"):
        k.add_tiles(x, y)  # compile and start the pool outside the profile

        local, worker_profiles, lock = threading.local(), [], threading.Lock()
        original = engine_module.Engine.execute

        def execute(self, task, block, lane):
            prof = getattr(local, "prof", None)
            if prof is None:
                prof = local.prof = cProfile.Profile()
                with lock:
                    worker_profiles.append(prof)
            prof.enable()
            try:
                return original(self, task, block, lane)
            finally:
                prof.disable()

        engine_module.Engine.execute = execute
        host = cProfile.Profile()
        try:
            host.enable()
            for _ in range(RUNS):
                k.add_tiles(x, y)
            host.disable()
        finally:
            engine_module.Engine.execute = original
    workers = pstats.Stats(worker_profiles[0])
    for prof in worker_profiles[1:]:
        workers.add(prof)
    host_stats = pstats.Stats(host)
    tasks = RUNS * k.N_TILES
    return "\n\n".join([
        f"Profile of {RUNS} compiled runs of add_tiles ({tasks} tasks), top {count} by tottime.",
        _top(host_stats, count, f"host thread (total {host_stats.total_tt * 1e6 / tasks:.1f} µs per task "
                                f"under the profiler)"),
        _top(workers, count, f"worker threads, {len(worker_profiles)} lanes merged (total "
                             f"{workers.total_tt * 1e6 / tasks:.1f} µs per task under the profiler)")])


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(profile(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
