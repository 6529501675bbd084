"""Benchmark 1 - per-task cost: 1024 tasks of one 8x8 add each, against a plain Python loop of the same torch ops.

Contenders (interleaved, median of repeats): the @pl.jit kernel `add_tiles` with coalescing off on the engine
(PYPTO_REPLAY=0: what every call whose course depends on data pays; each task runs its kernel's recorded torch
calls, see replay.kernel; also with that off, PYPTO_KERNEL_REPLAY=0: every task through the op
library's Python) and by default (the program depends only on
shapes, so after its recorded call it replays as straight-line torch calls), `add_tiles` as written (coalesced)
and on the reference executor, and `y[s] = torch.add(x[s], 1.0)` over the same 1024 row slices in a Python loop.
Also splits one compiled run with the engine's own counters (host submit time, time inside task bodies).
"""
from __future__ import annotations

import torch

from bench import jit_kernels as k
from bench.timing import interleaved, ms, ratio, table, us, verdict

TITLE = "1. Per-task cost: 1024 tasks of one 8x8 add"
TARGET, AIM = 2.0, 1.2


def plain_loop(x, y, n=k.N_TILES, t=k.TILE):
    for i in range(n):
        y[i * t : (i + 1) * t, :] = torch.add(x[i * t : (i + 1) * t, :], 1.0)


def engine_counters(fn) -> dict:
    """The engine's figures of one call of `fn` (run_stats: what PYPTO_STATS prints); empty for a replay."""
    from pypto_rt import run_stats

    with run_stats.collect() as stats:
        fn()
    return stats.engine or {}


PER_TILE = {"COALESCE": "0"}   # the knob in force when the per-tile kernel runs


def per_tile_kernel():
    """`add_tiles` compiled with coalescing off: one task per 8x8 tile, what this benchmark is about (its calls run
    under `PER_TILE`: each PYPTO_COALESCE setting has its own program)."""
    import pypto.language as pl
    from pypto_rt import config
    kernel = pl.jit(k.add_tiles.fn)
    with config.scope(**PER_TILE):
        kernel(torch.zeros(k.TILE * k.N_TILES, k.TILE))   # compile now, with coalescing off
    return kernel


def bodies_alone(kernel, x, y, repeats: int = 5) -> float | None:
    """Seconds per task body, as the engine runs it (its kernel replay, once recorded: see
    replay.kernel), back to back on this thread with no engine and no other Python thread; None
    when the runtime's internals have moved."""
    try:
        from pypto_rt.binding import bind_call
        from pypto_rt.orchestration.block import run_block
        from pypto_rt.orchestration.program import host_program
        from pypto_rt.orchestration.task_runner import kernel_replays
        artifact = host_program(kernel, coalesce=PER_TILE["COALESCE"]).kernels[0]
        replays = kernel_replays(artifact)
        body = replays.run if replays is not None else (
            lambda binding, inputs, block, n: run_block(binding, artifact.kernel.run, inputs, block, n))
        binding = bind_call(kernel, (x, y), {})
        xv, yv = binding.values

        def all_bodies():
            for i in range(k.N_TILES):
                body(binding, (i, xv, yv), 0, 1)

        return interleaved({"bodies": all_bodies}, repeats)["bodies"] / k.N_TILES
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None


def run(repeats: int = 11) -> str:
    from pypto_rt import config

    x = torch.randn(k.TILE * k.N_TILES, k.TILE)
    y_t, y_c, y_r, y_p, y_rp, y_k = (torch.empty_like(x) for _ in range(6))
    per_tile = per_tile_kernel()

    def tasks():
        with config.scope(REPLAY="0", **PER_TILE):
            per_tile(x, y_t)

    def tasks_through_op_library():
        with config.scope(REPLAY="0", KERNEL_REPLAY="0", **PER_TILE):
            per_tile(x, y_k)

    def replayed():
        with config.scope(**PER_TILE):
            per_tile(x, y_rp)

    def compiled():
        with config.scope(EXECUTOR="compiled"):
            k.add_tiles(x, y_c)

    def reference():
        with config.scope(EXECUTOR="reference"):
            k.add_tiles(x, y_r)

    t = interleaved({"tasks": tasks, "op library": tasks_through_op_library, "replayed": replayed,
                     "compiled": compiled, "reference": reference, "plain": lambda: plain_loop(x, y_p)}, repeats)
    for y in (y_t, y_k, y_rp, y_c, y_r, y_p):
        assert torch.equal(y, x + 1)
    from pypto_rt.replay.entry import decisions
    mode = decisions(per_tile)[0].reason
    n = k.N_TILES
    rows = [
        ["engine, one task per tile (PYPTO_COALESCE=0, PYPTO_REPLAY=0) / plain torch loop",
         ratio(t["tasks"] / t["plain"]), f"≤ {TARGET:g}x (aim {AIM:g}x): {verdict(t['tasks'] / t['plain'], TARGET)}"],
        ["the same, tasks through the op library's Python (PYPTO_KERNEL_REPLAY=0) / plain torch loop",
         ratio(t["op library"] / t["plain"]), "-"],
        [f"the same program by default: its recorded torch calls replayed ({mode}) / plain torch loop",
         ratio(t["replayed"] / t["plain"]),
         f"≤ {TARGET:g}x (aim {AIM:g}x): {verdict(t['replayed'] / t['plain'], TARGET)}"],
        ["compiled, default (the tile loop coalesces into one task per worker) / plain torch loop",
         ratio(t["compiled"] / t["plain"]), "-"],
        ["reference executor / plain torch loop", ratio(t["reference"] / t["plain"]), "-"],
    ]
    out = [table(["contender / baseline", "time ratio", "target"], rows), "",
           table(["per tile (1024 tiles, one run)", "engine, one task per tile", "replayed", "coalesced",
                  "reference", "plain loop"],
                 [["wall time / tile", us(t["tasks"] / n), us(t["replayed"] / n), us(t["compiled"] / n),
                   us(t["reference"] / n), us(t["plain"] / n)],
                  ["wall time / run", ms(t["tasks"]), ms(t["replayed"]), ms(t["compiled"]), ms(t["reference"]),
                   ms(t["plain"])]])]
    stats = engine_counters(tasks)
    alone = bodies_alone(per_tile, x, torch.empty_like(x))
    if stats:
        tasks = stats["tasks"] or 1
        out += ["", "One run with one task per tile, split by the engine's counters (PYPTO_STATS fields):", "",
                table(["where", "per task", "share of wall"],
                      [["host: orchestration until finish() (submit path)", us(stats["orchestration_ns"] / 1e9 / tasks),
                        f"{stats['orchestration_ns'] / stats['wall_ns']:.0%}"],
                       ["workers: inside task bodies (summed over lanes)", us(stats["kernel_ns"] / 1e9 / tasks),
                        f"{stats['kernel_ns'] / stats['wall_ns']:.0%}"],
                       ["the same task bodies (kernel replays) back to back on one thread (no engine, no other "
                        "threads)",
                        us(alone) if alone else "n/a", "-"],
                       ["plain torch: the same op on the same tile", us(t["plain"] / n), "-"],
                       [f"wall ({stats['workers']} workers, {stats['tasks']} tasks)", us(stats["wall_ns"] / 1e9 / tasks),
                        "100%"]])]
    return "\n".join(out)
