"""Benchmark 13 - the serving flagship (examples/serve/serve.py) at 1, 2 and 4 ranks: output tokens/s and where a
step's time goes (the model's forward, and of it the MoE layers: router, dispatch, experts, combine; the all-reduce before each step,
including the wait for the slowest rank; the host engine: scheduling and bookkeeping). The same seeded stream of
REQUESTS requests each time, spread over the ranks; FP32, every run's golden check must pass.

    .venv/bin/python -m bench --only serving_throughput      (or python -m bench.serving_throughput)
"""
from __future__ import annotations

import json
import os
import tempfile

from bench.timing import ms, ratio, table

TITLE = "13. Serving flagship: tokens/s at 1, 2 and 4 ranks"
SERVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "serve", "serve.py")
RANKS = (1, 2, 4)
REQUESTS = 24


def serve_once(nproc: int, requests: int) -> dict:
    """One launched run of the flagship; its figures (rank 0's --json)."""
    from pypto_rt.launch import launch
    with tempfile.TemporaryDirectory(prefix="pypto-bench-serve-") as tmp:
        path = os.path.join(tmp, "figures.json")
        result = launch(SERVE, "--requests", requests, "--json", path, nproc=nproc, log_dir=tmp)
        if not result.passed:
            raise RuntimeError(f"the flagship failed at {nproc} ranks:\n{result.report}")
        with open(path) as f:
            return json.load(f)


def run(full: bool = False) -> str:
    figures = {n: serve_once(n, REQUESTS * (2 if full else 1)) for n in RANKS}
    base = figures[RANKS[0]]["output_tokens_per_s"]
    rows = []
    for n, s in figures.items():
        host = 1 - s["model_share"] - s["agree_share"]
        rows.append([n, f"{s['output_tokens_per_s']:.1f}", ratio(s["output_tokens_per_s"] / base), s["steps"],
                     f"{s['batch_mean']:.1f}", ms(s["tpot_p50_s"]), ms(s["ttft_p50_s"]),
                     f"{100 * s['model_share']:.0f}%", f"{100 * s['moe_share']:.0f}%",
                     f"{100 * s['agree_share']:.0f}%", f"{100 * host:.0f}%",
                     "PASS" if s["passed"] else "FAIL"])
    return table(["ranks", "output tok/s", "vs 1 rank", "steps", "batch/rank", "TPOT p50", "TTFT p50",
                  "model forward", "of which MoE layers", "step all-reduce", "host", "golden"], rows) + (
        f"\n\n{REQUESTS * (2 if full else 1)} requests (`--size default`, FP32, seed 0), each run a fresh "
        f"`pypto-launch` job; the loop's time only (start-up, warm-up and the golden check excluded). With more "
        f"ranks than cores the ranks share the cores.")


if __name__ == "__main__":
    print(run())
