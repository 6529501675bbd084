"""Where a launched decode dispatch+combine's wall time goes, rank by rank (issue 14): an event trace of each
signal, each wait's start and return, and each call's start and end, in CLOCK_MONOTONIC (one clock for every
process of the host) with the rank's CPU time beside each, written per rank and merged by rank 0.

    .venv/bin/pypto-launch --nproc 4 bench/moe_trace.py [--form compiled|replayed] [--calls 50] [--skewed]
        [--shape decode|prefill]

Each rank builds the buffer and compiles its tiers as bench/moe_call_cpu.py does, then traces `--calls` calls with
no barrier between them. Rank 0 prints, per rank and per call on average: wall, own CPU; of the wall outside the
waits, the time without a core (wall - CPU there); of the waits, the time before the awaited signal was written
(the peer was still working or had no core) and after it (the wake-up: how late the wait saw it), matched by cell
and value to the peer's signal.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

from bench.moe_call_cpu import SHAPES
from bench.moe_rank import GLOO_TIMEOUT_S, compile_tiers, load_ours, make_buffer, tiered
from bench.moe_routing import MoEShape, make_inputs

EVENTS: list[tuple] = []   # (monotonic ns, thread CPU ns, kind, detail)


def _now() -> tuple[int, int]:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.thread_time_ns()


def _trace_effects(rank: int) -> None:
    """Record each notify (the cell it sets on which rank, and the value) and each wait (start, return)."""
    from pypto_rt.ops import distributed

    notify, wait = distributed._Notify.__call__, distributed._Wait.__call__

    def traced_notify(self, target, peer, offsets, kind, value):
        notify(self, target, peer, offsets, kind, value)
        EVENTS.append((*_now(), "signal", [int(peer), [int(o) for o in offsets], int(value)]))

    def traced_wait(self, signal, offsets, kind, label, expected):
        EVENTS.append((*_now(), "wait", [rank, [int(o) for o in offsets], int(expected)]))
        wait(self, signal, offsets, kind, label, expected)
        EVENTS.append((*_now(), "woke", None))
    distributed._Notify.__call__, distributed._Wait.__call__ = traced_notify, traced_wait


def _summary(ranks: list[list]) -> list[str]:
    """Per rank, per call on average: (wall, CPU, no core, waiting for the peer, wake-up) in ms."""
    signals = {}   # (waiting rank, offsets, value) -> when it was written
    for events in ranks:
        for t, _, kind, detail in events:
            if kind == "signal":
                signals[(detail[0], tuple(detail[1]), detail[2])] = t
    lines = []
    for rank, events in enumerate(ranks):
        calls = sum(1 for e in events if e[2] == "call")
        total = {"wall": 0, "cpu": 0, "no core": 0, "peer": 0, "wake": 0}
        start = prev = pending = None
        for t, cpu, kind, detail in events:
            if kind == "call":
                start = prev = (t, cpu)
                continue
            if kind == "woke":
                begun, who = prev[0], pending
                written = signals.get(who, begun)
                total["peer"] += max(0, written - begun)
                total["wake"] += t - max(written, begun)
            else:
                total["no core"] += max(0, (t - prev[0]) - (cpu - prev[1]))
            if kind == "wait":
                pending = (detail[0], tuple(detail[1]), detail[2])
            if kind == "end":
                total["wall"] += t - start[0]
                total["cpu"] += cpu - start[1]
            prev = (t, cpu)
        per = {k: v / max(calls, 1) / 1e6 for k, v in total.items()}
        lines.append(f"rank {rank}: wall {per['wall']:.2f} ms, CPU {per['cpu']:.2f}; outside waits without a core "
                     f"{per['no core']:.2f}; in waits before the peer's signal {per['peer']:.2f}, after it (wake-up) "
                     f"{per['wake']:.2f} ms per call ({calls} calls)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/moe_trace.py", description=__doc__.splitlines()[0])
    parser.add_argument("--form", choices=["compiled", "replayed"], default="compiled")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--skewed", action="store_true")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="decode")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        shape = MoEShape(*SHAPES[args.shape], args.skewed)
        x, topk_idx, topk_weights = make_inputs(shape, world, rank)
        buf, call, _ = make_buffer(load_ours(), shape, x, topk_idx.int(), topk_weights)
        compile_tiers(call, buf)
        run = tiered(call, buf, args.form == "compiled")
        for _ in range(20):
            run()
        _trace_effects(rank)
        dist.barrier()
        for _ in range(args.calls):
            EVENTS.append((*_now(), "call", None))
            run()
            EVENTS.append((*_now(), "end", None))
        everyone = [None] * world
        dist.all_gather_object(everyone, EVENTS)
        if rank == 0:
            path = os.path.join(tempfile.gettempdir(), f"moe_trace.{os.getpid()}.json")
            with open(path, "w") as f:
                json.dump(everyone, f)
            print("\n".join(_summary(everyone)) + f"\nevents of every rank: {path}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
