"""What a background compile costs the calls of its own process (issue 17: PYPTO_TIER=background is the default):
a small kernel replayed in a loop on the calling thread, timed per call, without a compile, while the tier
compiles another kernel in the background (in its compile process at nice 19, replay.tier_process; before issue
17's fix, on the worker thread, replay.tier_worker), and without again. The `max` column is the calling thread's
longest gap between calls.

    .venv/bin/python -m bench.tier_priority [--seconds 8] [--compile-seconds 60]

Idle priority keeps the compile's CPU and its C++ compiler behind busy threads; on a worker thread the compile's
Python held the process's GIL while it ran, and a worker preempted while holding it stalled the caller (seconds on
a loaded machine); in the compile process it holds only its own. Inductor is loaded before timing (a process's
first compile loads it: seconds). Run it next to the load you care about; the
machine's load average is printed with each line.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import pypto.language as pl

ROWS, COLS = 8, 16
# the replay kept at once (no engine trial); the compiled tier's trial never ends; compiled as soon as asked
NOW = dict(slower=float("inf"), trial_replays=0, tier_trial_calls=1 << 30, tier_after_replays=0,
           tier_after_replayed_ms=0.0)


def _kernel():
    @pl.jit
    def scale_into(x: pl.Tensor[[ROWS, COLS], pl.FP32], acc: pl.InOut[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            acc[:, :] = pl.add(pl.mul(acc[:, :], 0.5), pl.exp(x[:, :]))
        return acc
    return scale_into


def _calls(kernel, seconds: float, until=None) -> str:
    """Call `kernel` for `seconds` (or until `until()`); its per-call times."""
    x, acc = torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)
    ns, end = [], time.monotonic() + seconds
    while time.monotonic() < end and (until is None or not until()):
        t0 = time.perf_counter_ns()
        kernel(x, acc)
        ns.append(time.perf_counter_ns() - t0)
    ns.sort()
    return (f"{len(ns)} calls: p50 {ns[len(ns) // 2] / 1e3:.0f} µs, p99 {ns[int(len(ns) * 0.99)] / 1e3:.0f} µs, "
            f"mean {statistics.mean(ns) / 1e3:.0f} µs, max {ns[-1] / 1e6:.1f} ms (load average "
            f"{os.getloadavg()[0]:.1f})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds without a compile")
    parser.add_argument("--compile-seconds", type=float, default=60.0, help="at most this long while compiling")
    args = parser.parse_args(argv)

    from pypto_rt import config
    from pypto_rt.replay.policy import policy_scope
    from pypto_rt.replay.tier import COMPILING, tiers
    import torch._inductor.compile_fx  # noqa: F401

    hot, compiled = _kernel(), _kernel()
    with config.scope(TIER="off", EXECUTOR="compiled"):
        for _ in range(50):
            hot(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
        print("without a compile:", _calls(hot, args.seconds), flush=True)
        with config.scope(TIER="background"), policy_scope(**NOW):
            for _ in range(12):
                compiled(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
        (tier,) = tiers(compiled)
        start = time.monotonic()
        during = _calls(hot, args.compile_seconds, until=lambda: tier.state != COMPILING)
        print(f"while compiling ({time.monotonic() - start:.1f} s):", during, flush=True)
        print("  the compiled kernel:", tier.text, flush=True)
        print("without a compile:", _calls(hot, args.seconds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
