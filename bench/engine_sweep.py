"""Benchmark 2 - fixed and marginal cost of a run: a 1..4096 no-op task sweep, fitted to time = fixed + n*marginal.

Bare engine: `Engine()`, n x `submit(run=no-op)` (no accesses), `finish()`, `close()` - one run per sample.
Through @pl.jit: `add_tiles_n(x, n, y)` with PYPTO_COALESCE=0, n tasks of one 8x8 add each (the smallest task a
kernel can have; by default the loop coalesces into one task per worker, see benchmark 1), on the engine
(PYPTO_REPLAY=0) and replayed (what repeated calls of a program whose course depends only on shapes get).
Compared with the real PyPTO runtime's host engine: 43 µs per run, 8 µs per task.
"""
from __future__ import annotations

import statistics
import time

import torch

from bench import jit_kernels as k
from bench.timing import dur, line_fit, ratio, table, us, verdict

TITLE = "2. Fixed and marginal cost of a run (no-op task sweep, least-squares fit)"
SIZES = (1, 4, 16, 64, 256, 1024, 4096)
REAL_FIXED_S, REAL_PER_TASK_S = 43e-6, 8e-6
TARGET = 2.0
WARM_UP_CALLS = 30   # of the @pl.jit kernel before its sweep (its first ~15 calls are slower: the cold first run
                     # fades from the kernel's run history, which decides when its tasks may run on the host)


def _noop(block):
    return None


def bare_run(n: int) -> float:
    from pypto_rt.aicpu import Engine
    start = time.perf_counter()
    engine = Engine(name="sweep")
    try:
        for _ in range(n):
            engine.submit("noop", _noop)
        engine.finish()
    finally:
        engine.close()
    return time.perf_counter() - start


def sweep(run_n, sizes, repeats) -> list[float]:
    """Median seconds per run for each n, over `repeats` back-to-back runs of that n after one untimed run (so
    each figure is a steady state of repeated n-task runs, not the clean-up of a bigger run before it)."""
    medians = []
    for n in sizes:
        run_n(n)
        reps = repeats * 4 if n <= 64 else repeats  # small runs are cheap and the noisiest
        medians.append(statistics.median(run_n(n) for _ in range(reps)))
    return medians


def run(repeats: int = 7, jit_repeats: int = 3) -> str:
    from pypto_rt import config

    bare = sweep(bare_run, SIZES, repeats)
    x = torch.randn(k.TILE * k.MAX_TILES, k.TILE)
    y = torch.empty_like(x)

    import pypto.language as pl
    per_tile = pl.jit(k.add_tiles_n.fn)   # its own compiled program: coalescing off, one task per tile

    def jit_run(n, replay="0"):
        start = time.perf_counter()
        with config.scope(EXECUTOR="compiled", COALESCE="0", REPLAY=replay):
            per_tile(x, n, y)
        return time.perf_counter() - start

    def replayed_run(n):
        for _ in range(6):   # past the engine runs and the recording of this n (a scalar: its own specialisation)
            jit_run(n, "1")
        return jit_run(n, "1")

    for _ in range(WARM_UP_CALLS):   # a steady state: past compiling, recording and the first runs' slow tasks
        jit_run(1)
    jit = sweep(jit_run, SIZES, jit_repeats)
    replayed = sweep(replayed_run, SIZES, jit_repeats)
    fits = {name: line_fit(SIZES, ts) for name, ts in (
        ("bare engine", bare), ("@pl.jit add_tiles_n on the engine (PYPTO_REPLAY=0), one task per tile", jit),
        ("@pl.jit add_tiles_n replayed (the default once recorded)", replayed))}
    rows = []
    for name, (fixed, per_task, worst) in fits.items():
        rows.append([name, us(fixed), us(per_task),
                     f"{ratio(fixed / REAL_FIXED_S)} ({verdict(fixed / REAL_FIXED_S, TARGET)} ≤ 2x)",
                     f"{ratio(per_task / REAL_PER_TASK_S)} ({verdict(per_task / REAL_PER_TASK_S, TARGET)} ≤ 2x)",
                     f"{worst:.0%}"])
    out = [table(["path", "fixed / run", "marginal / task", "fixed vs PyPTO 43 µs", "marginal vs PyPTO 8 µs",
                  "worst fit residual"], rows), "",
           "Fit: least squares weighted by 1/time² (relative residuals) over n = 1, 4, ..., 4096. "
           "Median time per run by sweep size (time / n in brackets):", "",
           table(["n tasks"] + [str(n) for n in SIZES],
                 [["bare engine"] + [f"{dur(t)} ({us(t / n)})" for n, t in zip(SIZES, bare)],
                  ["@pl.jit, engine"] + [f"{dur(t)} ({us(t / n)})" for n, t in zip(SIZES, jit)],
                  ["@pl.jit, replayed"] + [f"{dur(t)} ({us(t / n)})" for n, t in zip(SIZES, replayed)]])]
    return "\n".join(out)
