"""`make bench` (= `python -m bench`): the benchmark suite, one module per benchmark, markdown out.

Every table holds ratios measured in this one run (medians of interleaved repeats); ratios, not seconds, are
what carry between machines. Targets are reported, never asserted. `python -m bench --only per_task,kernels`
runs a subset; `--full` gives benchmarks with a quick default their full set; `python -m bench.profile_tasks`
profiles benchmark 1.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import platform
import sys
import time

from bench.timing import load_average

# as pypto-run does: idle OpenMP threads must not spin against the runtime's workers (read when torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# no background compile (PYPTO_TIER) lands inside a timed loop: tables stay comparable; benchmark 16 asks for it
os.environ.setdefault("PYPTO_TIER", "off")

BENCHMARKS = ("per_task", "engine_sweep", "kernels", "parallel", "compile_time", "collectives", "determinism",
              "coalesce_memory", "moe_experts", "moe_dispatch", "serving_host", "serving_step",
              "serving_throughput", "paged_kv", "ray_launch", "tiering", "replay_entry")


def header(argv) -> str:
    import torch

    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    warning = (f"**Warning: load average {busy:.2f} before the suite started: another job is using this machine's "
               f"cores. Single-thread ratios hold up (contenders are interleaved); parallel ones will not.**  "
               if busy > 0.5 else None)

    command = " ".join([os.path.relpath(sys.executable), "-m", "bench"] + argv)
    knobs = {k: v for k, v in os.environ.items() if k.startswith("PYPTO_")}
    return "\n".join(line for line in [
        "# pypto-rt benchmarks", "",
        f"Command: `{command}`  ",
        f"Machine: {os.cpu_count()} CPU cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"load average at start {load_average()}  ",
        warning,
        f"PYPTO_* knobs set: {knobs or 'none'} (each benchmark picks its executor explicitly)  ",
        "Figures: medians of interleaved repeats; torch threads = 1 on the calling thread unless a table says "
        "otherwise; the compiled runtime's workers set their own count (see benchmark 4)."] if line is not None)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--full", action="store_true",
                        help="benchmarks with a quick default (moe_dispatch) run their full shape set")
    args = parser.parse_args(argv)
    chosen = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")

    import torch

    start = time.perf_counter()
    print(header(argv), flush=True)
    for name in chosen:
        module = importlib.import_module(f"bench.{name}")
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        takes_full = "full" in inspect.signature(module.run).parameters
        body = module.run(full=True) if args.full and takes_full else module.run()
        print(f"\n## {module.TITLE}\n\n{body}\n\n_({name}: {time.perf_counter() - t0:.1f} s)_", flush=True)
    print(f"\nTotal: {time.perf_counter() - start:.1f} s; load average at end {load_average()}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
