"""The compiled tier's cold build of long replays (issue 17): a replay compiled whole against one cut into segments
of at most `tier_max_segment_calls` torch lines (replay.tier_segments), for a synthetic rms_norm unrolled over
TILES row tiles (8 lines a tile) and for conformance kernels; cold = a fresh inductor cache folder and a fresh compile
process (warmed on a small other graph first, so its start is not counted). Per build: wall seconds (the tier's
`compile_s`), the compile process's CPU seconds (its own and its C++ compilers', /proc), and the call's time,
compiled against replayed (interleaved, min of the repeats).

    .venv/bin/python -m bench.tier_build --tiles 16,64 --max 0,96 [--kernels c03,c05]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

import torch

import pypto.language as pl
from bench import conformance
from bench.tiering import _force
from bench.timing import interleaved, load_average, table

ROWS, H = 8, 256


_SYNTHETIC = """
import pypto.language as pl

TILES, ROWS, H = {tiles}, {rows}, {h}


@pl.jit
def rms(x: pl.Tensor[[TILES * ROWS, H], pl.FP32], gamma: pl.Tensor[[1, H], pl.FP32],
        y: pl.Out[pl.Tensor[[TILES * ROWS, H], pl.FP32]]):
    for tb in pl.range(TILES):
        t0 = tb * ROWS
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rms"):
            xt = x[t0:t0 + ROWS, :]
            inv = pl.rsqrt(pl.add(pl.mul(pl.row_sum(pl.mul(xt, xt)), 1.0 / H), 1e-6))
            y[t0:t0 + ROWS, :] = pl.col_expand_mul(pl.row_expand_mul(xt, inv), gamma)
    return y
"""


def synthetic(tiles: int, folder: str):
    """An rms_norm over `tiles` row tiles of ROWS x H fp32 (8 replay lines a tile; written to a module in `folder`:
    the DSL reads its source), with inputs."""
    path = os.path.join(folder, f"synthetic_rms_{tiles}.py")
    with open(path, "w") as f:
        f.write(_SYNTHETIC.format(tiles=tiles, rows=ROWS, h=H))
    spec = importlib.util.spec_from_file_location(f"synthetic_rms_{tiles}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.randn(tiles * ROWS, H)
    return module.rms, [x, torch.randn(1, H), torch.empty_like(x)]


def _child_cpu() -> float:
    """CPU seconds of the eager compile process so far (its own and its waited-for children's)."""
    from pypto_rt.replay import tier_process

    child = tier_process._slots[False].child
    if child is None:
        return 0.0
    with open(f"/proc/{child.process.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _fresh(folder: str) -> None:
    """A fresh inductor cache folder and compile process, warmed on a graph of its own."""
    from pypto_rt.replay import tier_process

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(dir=folder)
    slot = tier_process._slots[False]
    with slot.lock:
        tier_process._stop(slot)
    entry, args = synthetic(1, folder)
    _build(entry, args, 0)


def _build(entry, args, max_calls: int):
    from pypto_rt import config
    from pypto_rt.replay.policy import policy_scope
    from pypto_rt.replay.tier import tiers

    with config.scope(TIER="eager"), policy_scope(slower=float("inf"), trial_replays=0, tier_trial_calls=1 << 30,
                                                  tier_max_segment_calls=max_calls):
        for _ in range(8):   # engine runs, the recording, the first replay (which compiles)
            entry(*args)
    return tiers(entry)


def measure(make, max_calls: int, folder: str, repeats: int) -> dict:
    entry, args = make(folder)
    _fresh(folder)
    from pypto_rt.replay import tier_process

    cpu, cache = _child_cpu(), list(tier_process.cache)
    found = _build(entry, args, max_calls)
    cpu = _child_cpu() - cpu
    tier = found[0]
    hits = f"{tier_process.cache[0] - cache[0]} / {tier_process.cache[1] - cache[1]}"
    row = dict(wall=tier.compile_s, cpu=cpu, text=tier.text, calls=None, hits=hits)
    if all(t.tiered is not None for t in found):
        def mode(compiled: bool):
            def call():
                _force(entry, compiled)
                entry(*args)
            return call
        t = interleaved({"compiled": mode(True), "replayed": mode(False)}, repeats, statistic=min)
        row.update(calls=(t["compiled"], t["replayed"]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", default="16,64")
    parser.add_argument("--max", default="0,96", help="tier_max_segment_calls per build (0: whole)")
    parser.add_argument("--kernels", default="", help="conformance kernels, e.g. c03,c05")
    parser.add_argument("--repeats", type=int, default=30)
    a = parser.parse_args()
    torch.set_num_threads(1)
    cases = [(f"synthetic {n} tiles ({8 * int(n)} lines)", lambda folder, n=int(n): synthetic(n, folder))
             for n in a.tiles.split(",") if n]
    for name in filter(None, a.kernels.split(",")):
        path = next(p for p in conformance.paths() if conformance.short(p).startswith(name))

        def make(folder, path=path):
            case = conformance.case(path)
            return case.entry, case.args
        cases.append((conformance.short(path), make))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        print(f"load before: {load_average()}", flush=True)
        for name, make in cases:
            for max_calls in [int(m) for m in a.max.split(",")]:
                r = measure(make, max_calls, folder, a.repeats)
                calls = f"{r['calls'][0] * 1e6:.0f} / {r['calls'][1] * 1e6:.0f} us" if r["calls"] else "-"
                rows.append([name, max_calls or "whole", f"{r['wall']:.1f} s", f"{r['cpu']:.1f} s", r["hits"], calls,
                             r["text"][:150]])
                print(" | ".join(map(str, rows[-1])), flush=True)
        print(f"load after: {load_average()}")
    print(table(["replay", "max lines", "cold build (wall)", "compile CPU", "graphs from the cache / built",
                 "call compiled / replayed (min)", "tier"],
                rows))


if __name__ == "__main__":
    main()
