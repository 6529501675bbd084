"""Benchmark 4 - parallel speed-up on 2 cores with big tasks: `matmul_512` (FP32 1024^3 GEMM, four 512x512 output
tiles, ~10 ms per task on one thread), one configuration of workers x torch threads per fresh subprocess.

Workers come from PYPTO_NUM_WORKERS, torch threads per worker from PYPTO_WORKER_THREADS. Every child reads the
count a worker really runs with, inside a task.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from bench.timing import ms, ratio, table, verdict

TITLE = "4. Parallel speed-up on 2 cores, tasks of ~10 ms (matmul_512)"
LABELS = ("1 worker x 1 thread", "2 workers x 1 thread", "1 worker x 2 threads", "default (no knobs)")
SPEEDUP_TARGET, DEFAULT_SLACK = 1.6, 1.10
KNOB = "PYPTO_WORKER_THREADS"


def configs() -> dict[str, dict]:
    """label -> environment of the child."""
    return {LABELS[0]: {"PYPTO_NUM_WORKERS": "1", KNOB: "1"}, LABELS[1]: {"PYPTO_NUM_WORKERS": "2", KNOB: "1"},
            LABELS[2]: {"PYPTO_NUM_WORKERS": "1", KNOB: "2"}, LABELS[3]: {}}


def _worker_threads() -> tuple[int, int]:
    """(workers, torch threads) that the pool's workers actually run with, read inside a task."""
    import torch

    from pypto_rt.aicpu import Engine
    with Engine(name="probe") as engine:
        probe = engine.submit("threads", lambda block: torch.get_num_threads())
        engine.finish()
    return engine.num_workers, probe.result


def child(repeats: int) -> None:
    import time

    import torch

    from bench import jit_kernels as k

    a, b = torch.randn(k.MM, k.MK), torch.randn(k.MK, k.MN)
    c, g = torch.empty(k.MM, k.MN), torch.empty(k.MM, k.MN)
    k.matmul_512(a, b, c)  # compile + warm-up
    assert torch.allclose(c, a @ b, rtol=1e-4, atol=1e-3)
    before = _worker_threads()

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def torch_matmul(threads):
        torch.set_num_threads(threads)
        return timed(lambda: torch.matmul(a, b, out=g))

    samples = [timed(lambda: k.matmul_512(a, b, c)) for _ in range(repeats)]
    after = _worker_threads()
    # The control comes last: once this thread has run an OpenMP team, its idle threads spin for a while after
    # each GEMM and slow the workers down (measured: 1 worker x 1 thread, 30 ms -> 66 ms when interleaved).
    torch1 = [torch_matmul(1) for _ in range(repeats)]
    torch2 = [torch_matmul(2) for _ in range(repeats)]
    print(json.dumps({"workers": before[0], "threads": before[1], "threads_after": after[1], "samples": samples,
                      "torch1": torch1, "torch2": torch2}))


def _spawn(env_extra: dict, repeats: int) -> dict:
    drop = {"PYPTO_NUM_WORKERS", KNOB}
    env = {key: v for key, v in os.environ.items() if key not in drop}
    env.update(env_extra)
    env.pop("PYPTO_EXECUTOR", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "bench.parallel", "--child", str(repeats)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"bench.parallel child failed ({env_extra}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(repeats: int = 5, rounds: int = 3) -> str:
    chosen = configs()
    results = {label: {"samples": [], "torch1": [], "torch2": []} for label in chosen}
    for _ in range(rounds):  # configurations alternate, so a busy phase of the machine hits all of them
        for label, env in chosen.items():
            got = _spawn(env, repeats)
            results[label].setdefault("seen", set()).update({(got["workers"], got["threads"]),
                                                             (got["workers"], got["threads_after"])})
            for key in ("samples", "torch1", "torch2"):
                results[label][key] += got[key]
    t = {label: statistics.median(r["samples"]) for label, r in results.items()}
    default = LABELS[3]
    t1 = statistics.median(sum((r["torch1"] for r in results.values()), []))
    t2 = statistics.median(sum((r["torch2"] for r in results.values()), []))
    rows = [[label, ", ".join(f"{w} x {n}" for w, n in sorted(r["seen"])), ms(t[label]), ratio(t[label] / t1)]
            for label, r in results.items()]
    speedup = t[LABELS[0]] / t[LABELS[1]]
    fastest = {label: min(r["samples"]) for label, r in results.items()}
    speedup_fastest = fastest[LABELS[0]] / fastest[LABELS[1]]
    best_label = min((LABELS[2], LABELS[1]), key=t.get)
    default_vs_best = t[default] / t[best_label]
    same_as_best = results[default]["seen"] == results[best_label]["seen"]
    default_verdict = verdict(default_vs_best, DEFAULT_SLACK)
    if same_as_best:   # the default runs the best configuration itself: its ratio is process-to-process noise
        default_verdict = f"meets (the default runs {best_label} itself: {default_verdict} by timing alone)" \
            if default_verdict != "meets" else default_verdict
    out = [table(["configuration", "workers x threads (read inside a task)", "time / run",
                  "vs torch a@b, 1 thread"], rows), "",
           table(["ratio", "value", "target"],
                 [["speed-up: (1 worker x 1 thread) / (2 workers x 1 thread)", ratio(speedup),
                   f"≥ {SPEEDUP_TARGET:g}x: {verdict(speedup, SPEEDUP_TARGET, higher_is_better=True)}"],
                  [f"default / best of the two 2-core configurations ({best_label})", ratio(default_vs_best),
                   f"≤ {DEFAULT_SLACK:g}x: {default_verdict}"],
                  ["the same speed-up from the fastest run of each (less sensitive to other jobs)",
                   ratio(speedup_fastest), "-"],
                  ["control: torch a@b 1 thread / 2 threads, same processes (the machine's free parallelism now)",
                   ratio(t1 / t2), "-"]]), "",
           f"Each configuration: a fresh process, {rounds} rounds x {repeats} runs (after a warm-up), median; each "
           "process then times torch's own GEMM at 1 and 2 threads (the control). "
           + f"Threads per worker set with {KNOB}. "
           + "When the control is well under 2x, another job holds a core and no speed-up figure here can reach its "
           "target."]
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    else:
        print(run())
