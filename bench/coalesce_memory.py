"""Benchmark 8 - peak memory of coalesced elementwise loops over a big tensor, one fresh subprocess per kernel and
configuration: one task per tile (`PYPTO_COALESCE=0`), coalesced without a bound on the chunk
(`PYPTO_COALESCE_CHUNK_MB=0`, as before the bound existed) and coalesced with the default bound. Kernels: a tile
loop around a region (`add_one`: its iterations merge into tasks) and a tile loop inside one region (`exp_inner`:
it runs as wide passes).

Each child makes its input and output (both touched, so their pages count before the call), runs the
kernel once on the engine (`PYPTO_REPLAY=0`) and reports how far the call raised the process's peak
resident memory (`ru_maxrss`) above what it held before. `python -m bench.coalesce_memory [MiB]` sets the
tensor size (default 512 MiB).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pypto.language as pl
from bench.timing import ms, ratio, table

TITLE = "8. Peak memory of a coalesced elementwise loop over a big tensor"
COLS, TILE = 4096, 64
LABELS = ("one task per tile", "coalesced, chunk unbounded", "coalesced, default chunk bound")


def configs() -> dict[str, dict]:
    return {LABELS[0]: {"PYPTO_COALESCE": "0"}, LABELS[1]: {"PYPTO_COALESCE_CHUNK_MB": "0"}, LABELS[2]: {}}


@pl.jit
def add_one(x: pl.Tensor, y: pl.Out[pl.Tensor]):
    for r in pl.parallel(0, x.shape[0], TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add"):
            y[r : r + TILE, :] = pl.add(x[r : r + TILE, :], 1.0)
    return y


@pl.jit
def exp_inner(x: pl.Tensor, y: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="exp"):
        for rb in pl.range(x.shape[0] // TILE):
            r0 = rb * TILE
            y[r0 : r0 + TILE, :] = pl.exp(x[r0 : r0 + TILE, :])
    return y


KERNELS = {"add_one": add_one, "exp_inner": exp_inner}


def child(name: str, mib: int) -> None:
    import resource
    import time

    import torch

    rows = mib * 2**20 // (COLS * 4) // TILE * TILE
    x, y = torch.ones(rows, COLS), torch.full((rows, COLS), 7.0)
    kernel = KERNELS[name]
    kernel.compile(x, y)   # the host program and kernel, before the peak is read
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    kernel(x, y)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert torch.equal(y[-1], x[-1] + 1) if name == "add_one" else torch.allclose(y[-1], x[-1].exp())
    print(json.dumps({"tensor_mib": rows * COLS * 4 / 2**20, "extra_mib": (peak - before) / 1024,
                      "seconds": seconds}))


def _spawn(env_extra: dict, name: str, mib: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYPTO_COALESCE", "PYPTO_COALESCE_CHUNK_MB")}
    env.update(env_extra, PYPTO_REPLAY="0", PYPTO_EXECUTOR="compiled")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "bench.coalesce_memory", "--child", name, str(mib)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"bench.coalesce_memory child failed ({env_extra}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(mib: int = 512) -> str:
    rows, size = [], 0.0
    for name in KERNELS:
        got = {label: _spawn(env, name, mib) for label, env in configs().items()}
        base, unbounded = (max(got[label]["extra_mib"], 1.0) for label in LABELS[:2])
        rows += [[f"`{name}`, {label}", f"{g['extra_mib']:.0f} MiB", ratio(g["extra_mib"] / base),
                  ratio(g["extra_mib"] / unbounded), ms(g["seconds"])] for label, g in got.items()]
        size = got[LABELS[0]]["tensor_mib"]
    return table([f"kernel, configuration ({size:.0f} MiB input and output, FP32, tiles of {TILE} rows)",
                  "peak memory above the tensors", "vs one task per tile", "vs coalesced unbounded",
                  "time of the call"], rows)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 512))
