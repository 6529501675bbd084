"""Benchmark 15 - launching on Ray: `pypto-launch --backend ray` against the local backend, at 2 and 4 ranks.

One short job per backend and world: every rank builds the shm communicator (the job's rendezvous), does one
allreduce (the first collective), then CALLS timed 1 KiB allreduces, and prints its times. Figures: start-up to
first collective = from the `launch()` call to the slowest rank's first allreduce; end-to-end = the `launch()`
call; per-collective latency = the slowest rank's mean over the timed calls (all ranks on one node: the same shm
path on both backends). Contenders: `local`; `ray (own)`, a job that starts and stops its own Ray instance (no
--address); `ray (attached)`, a job on a Ray session the caller already holds (as on a running cluster). Jobs are
interleaved per repeat. `python -m bench.ray_launch [--repeats R]` prints the table on its own.
"""
from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import textwrap
import time

from bench.timing import ratio, table, us

TITLE = "15. Launching on Ray: start-up, end-to-end and per-collective latency vs the local backend"
CALLS = 200
WORLDS = (2, 4)
RANK_PROGRAM = textwrap.dedent(f"""
    import time
    import torch
    from pypto_rt.collective import create_communicator
    comm = create_communicator("shm")
    t = torch.ones(256)
    comm.allreduce(t)
    first = time.time()
    start = time.perf_counter()
    for _ in range({CALLS}):
        comm.allreduce(t)
    per_call = (time.perf_counter() - start) / {CALLS}
    comm.close()
    print(f"BENCH first={{first!r}} per_call={{per_call!r}}")
""")


def _job(program: str, nproc: int, backend: str) -> dict:
    from pypto_rt.launch import launch
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as logs:
        start = time.time()
        result = launch(program, nproc=nproc, backend=backend, log_dir=logs)
        end = time.time()
        if not result.passed:
            raise RuntimeError(f"bench job on {backend} failed:\n{result.report}")
        found = []
        for rank in range(nproc):
            with open(os.path.join(logs, f"rank{rank}.stdout.log")) as f:
                m = re.search(r"BENCH first=([\d.e+-]+) per_call=([\d.e+-]+)", f.read())
            found.append((float(m.group(1)), float(m.group(2))))
    return {"startup": max(f for f, _ in found) - start, "total": end - start, "per_call": max(p for _, p in found)}


def run(repeats: int = 1) -> str:
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")   # the instances this benchmark starts are its own
    with tempfile.TemporaryDirectory(prefix="bench-ray-prog-") as folder:
        program = os.path.join(folder, "first_collective.py")
        with open(program, "w") as f:
            f.write(RANK_PROGRAM)
        samples: dict = {}
        for _ in range(repeats):
            for world in WORLDS:
                samples.setdefault(("local", world), []).append(_job(program, world, "local"))
                samples.setdefault(("ray (own)", world), []).append(_job(program, world, "ray"))
                ray.init(num_cpus=world, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
                try:
                    samples.setdefault(("ray (attached)", world), []).append(_job(program, world, "ray"))
                finally:
                    ray.shutdown()
    return _table(samples, repeats)


def _medians(runs: list[dict]) -> dict:
    return {k: statistics.median(run[k] for run in runs) for k in ("startup", "total", "per_call")}


def _table(samples: dict, repeats: int) -> str:
    rows = []
    for world in WORLDS:
        local = _medians(samples[("local", world)])
        for name in ("local", "ray (own)", "ray (attached)"):
            fig = _medians(samples[(name, world)])
            rows.append([str(world), name, f"{fig['startup']:.1f} s", f"{fig['total']:.1f} s", us(fig["per_call"]),
                         ratio(fig["startup"] / local["startup"]), ratio(fig["per_call"] / local["per_call"])])
    return "\n".join([
        table(["ranks", "backend", "start-up to 1st collective", "end-to-end", f"1 KiB allreduce (mean of {CALLS})",
               "start-up vs local", "allreduce vs local"], rows),
        "",
        f"Medians of {repeats} interleaved repeat(s). Target: the allreduce ratio ~1.0x (ranks on one node use the "
        "same shm path on both backends); Ray's start-up cost is reported, not targeted."])


if __name__ == "__main__":
    reps = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 1
    print(run(reps))
