"""Timing and reporting helpers shared by the benchmarks: medians, interleaved A/B timing, a line fit, tables.

The bench machine is shared (other jobs may hold a core), so every comparison is measured interleaved: each
repeat times every contender once, back to back, and the reported figure is the median per contender. Slow
phases of the machine then hit all contenders alike instead of one of them.
"""
from __future__ import annotations

import math
import os
import statistics
import time

_clock = time.perf_counter


def calibrate(fn, min_s: float = 0.002, max_calls: int = 1000) -> int:
    """How many calls of `fn` make one sample of at least `min_s` (1 for anything slower)."""
    start = _clock()
    fn()
    once = _clock() - start
    return 1 if once >= min_s else min(max_calls, max(1, math.ceil(min_s / max(once, 1e-7))))


def sample(fn, calls: int) -> float:
    """Seconds per call of `fn`, averaged over `calls` back-to-back calls."""
    start = _clock()
    for _ in range(calls):
        fn()
    return (_clock() - start) / calls


def interleaved(contenders: dict, repeats: int, warmup: int = 1, min_s: float = 0.002,
                statistic=statistics.median) -> dict[str, float]:
    """Median (or `statistic`) seconds per call of each contender; every repeat times each one once, in turn."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    calls = {name: calibrate(fn, min_s) for name, fn in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            times[name].append(sample(fn, calls[name]))
    return {name: statistic(ts) for name, ts in times.items()}


def line_fit(xs, ys) -> tuple[float, float, float]:
    """Least squares y = a + b*x weighted by 1/y^2 (relative residuals, so a geometric sweep's small sizes count
    as much as its big ones); returns (a, b, worst relative residual)."""
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    my = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx
    a = my - b * mx
    worst = max(abs(y - (a + b * x)) / y for x, y in zip(xs, ys))
    return a, b, worst


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ratio(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def us(seconds: float) -> str:
    v = seconds * 1e6
    return f"{v:.1f} µs" if v < 100 else f"{v:.0f} µs"


def ms(seconds: float) -> str:
    v = seconds * 1e3
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"


def dur(seconds: float) -> str:
    """µs below a millisecond, ms above."""
    return us(seconds) if seconds < 1e-3 else ms(seconds)


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "misses"


def table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def load_average() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"
