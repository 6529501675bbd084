"""Where one rank's decode dispatch+combine goes (issue 14's effect work): CPU time per call and, with --profile,
cProfile's top functions, inside a launched job with the bench's shape and MoEBuffer, no barriers between calls.

    .venv/bin/pypto-launch --nproc 2 bench/moe_call_cpu.py [--form compiled|replayed] [--calls 200] [--profile]
        [--sort tottime|cumulative] [--shape decode|decode128|prefill] [--skewed] [--poll-ab 0,auto,3000 [--rounds 8]]
        [--barrier] [--sums every|live|auto] [--dump-tiers DIR]

Each rank builds the buffer as bench.moe_rank does (checked against the golden), compiles its replays with
PYPTO_TIER=eager as `bench.moe_dispatch --tier eager` does, then times `--calls` calls of the chosen form (compiled:
every tier swapped in; replayed: the replays) after 20 untimed ones: wall time and `time.thread_time` (CPU of the
calling thread, waits' polls included, and without them) per call. Rank 0 prints the profile (in thread CPU time) of
as many more calls. `--shape prefill` takes the bench's prefill row (T=1024, H=1024, top-8; at 8 ranks some of its
segments stay replayed: `--dump-tiers` says which), `--skewed` its skewed routing (every token to rank 0's experts).
`--poll-ab` alternates the shm waits' poll settings (microseconds as PYPTO_SHM_POLL_US, `auto`: the adaptive policy;
`y<N>s<US>`: N yields, then sleeps doubling up to US microseconds, the oversubscribed waits' backoff) in blocks of
`--calls // --rounds` calls inside the one job, every rank switching at the same call, and prints each setting's
wall and CPU per call summed over its blocks (an A/B under the same load). `--barrier` also times calls each after a
barrier (gloo's, as bench.moe_rank, or the shm communicator's), alone and each right after a baseline call: what a
barrier's sleep and a gloo all_to_all just before cost the next call. `--sums` sets which sums a compiled live
layout's combine takes (kernels.moe.dispatch.COMPILED_SUMS: every route slot or the live routes only, or "auto": by
the ranks and the row length, Layout.live_sums; default: the module's, "auto").
`--dump-tiers DIR` writes rank 0's compiled tiers' descriptions there (segments compiled, kept replayed, why).
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import os
import pstats
import statistics
import time

import torch
import torch.distributed as dist

from bench.moe_rank import GLOO_TIMEOUT_S, compile_tiers, load_ours, make_buffer, tiered
from bench.moe_routing import MoEShape, make_inputs


SHAPES = {"decode": ("decode", 8, 4096, 6), "decode128": ("decode", 128, 4096, 6),   # bench.moe_routing's rows
          "prefill": ("prefill", 1024, 1024, 8)}
_waits_wall = [0.0]   # wall seconds spent inside the shm communicator's waits
_in_waits = [0.0]   # CPU seconds spent inside the shm communicator's waits (their spins, yields and sleeps)
_wait_override: dict = {}   # backoff_wait arguments a --poll-ab setting `y<yields>s<max sleep us>` sets


def _count_waits() -> None:
    """Count the CPU of the shm communicator's backoff waits in _in_waits (the polls' CPU follows the peer's lateness,
    which other jobs on the host set: the CPU outside them is the call's own)."""
    from pypto_rt.collective import shm_communicator

    real = shm_communicator.backoff_wait

    def counted(*args, **kwargs):
        kwargs.update(_wait_override)
        start, wall = time.thread_time(), time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            _in_waits[0] += time.thread_time() - start
            _waits_wall[0] += time.perf_counter() - wall
    shm_communicator.backoff_wait = counted


def per_call(run, calls: int) -> tuple[float, float, float, float]:
    """(wall ms, CPU ms, CPU ms in waits, process CPU ms: every thread's, OpenMP's and gloo's too) per call."""
    wall, cpu, waits, process = time.perf_counter(), time.thread_time(), _in_waits[0], time.process_time()
    for _ in range(calls):
        run()
    return tuple((t / calls * 1e3) for t in (time.perf_counter() - wall, time.thread_time() - cpu,
                                              _in_waits[0] - waits, time.process_time() - process))


def profile(run, calls: int, top: int = 40, sort: str = "tottime") -> str:
    prof = cProfile.Profile(time.thread_time)   # CPU, not wall: a rank without a core accrues nothing
    prof.enable()
    for _ in range(calls):
        run()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats(sort).print_stats(top)
    return text.getvalue()


def poll_ab(run, settings: list[str], calls: int, rounds: int, rank: int) -> None:
    """Alternate the shm communicator's poll settings in blocks of calls; print each one's sums (see --poll-ab)."""
    from pypto_rt.collective import process
    comm = process.communicator("bench/moe_call_cpu.py --poll-ab")
    block = max(calls // rounds, 1)
    sums = {s: [0.0, 0.0, 0.0] for s in settings}
    for _ in range(rounds):
        for setting in settings:
            if setting.startswith("y"):   # the waits' yields and longest sleep (oversubscribed: no futex)
                yields, sleep_us = setting[1:].split("s")
                _wait_override.update(yields=int(yields), max_sleep=int(sleep_us) * 1e-6)
            else:
                _wait_override.clear()
                comm.set_poll_us(None if setting == "auto" else int(setting))
            per_call(run, 2)   # the switch's own calls are not counted
            wall, cpu, waits, _ = per_call(run, block)
            total = sums[setting]
            total[0], total[1], total[2] = total[0] + wall / rounds, total[1] + cpu / rounds, total[2] + waits / rounds
    comm.set_poll_us(None)
    _wait_override.clear()
    for setting, (wall, cpu, waits) in sums.items():
        print(f"rank {rank} poll {setting}: wall {wall:.3f} ms, CPU {cpu:.3f} ms per call ({cpu - waits:.3f} ms "
              f"outside the waits' polls), {rounds} blocks of {block} calls", flush=True)


def barriered(run, calls: int, rank: int, x, topk_idx, topk_weights) -> None:
    """Median and mean wall ms of `calls` calls each after a barrier, and the wall of their shm waits: after gloo's
    barrier (bench.moe_rank's) or the shm communicator's (which spins), alone or each right after a baseline call."""
    from bench.moe_baseline import GlooDispatch
    from bench.moe_routing import EXPERTS_PER_RANK
    from pypto_rt.collective import process

    base = GlooDispatch(EXPERTS_PER_RANK)
    comm = process.communicator("bench/moe_call_cpu.py --barrier")

    def baseline():
        recv = base.dispatch(x, topk_idx, topk_weights)
        base.combine(recv.x, recv.handle)

    for label, before, barrier in (("gloo barrier, alone", None, dist.barrier),
                                   ("gloo barrier, after a baseline call", baseline, dist.barrier),
                                   ("shm barrier, alone", None, comm.barrier),
                                   ("shm barrier, after a baseline call", baseline, comm.barrier)):
        samples, waited = [], 0.0
        for _ in range(calls):
            if before is not None:
                barrier()
                before()
            barrier()
            start, waits = time.perf_counter(), _waits_wall[0]
            run()
            samples.append(time.perf_counter() - start)
            waited += _waits_wall[0] - waits
        print(f"rank {rank} {label}: median wall {statistics.median(samples) * 1e3:.3f} ms, mean "
              f"{statistics.mean(samples) * 1e3:.3f} ms, of which {waited / calls * 1e3:.3f} ms in the shm waits",
              flush=True)


def _dump_tiers(tiers: list[dict], folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for i, tier in enumerate(tiers):
        with open(os.path.join(folder, f"{i}_{tier['entry']}.txt"), "w") as f:
            f.write(tier["text"] or "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/moe_call_cpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--form", choices=["compiled", "replayed"], default="compiled")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="rank 0 prints cProfile's top functions")
    parser.add_argument("--sort", default="tottime", help="the profile's order (pstats: tottime, cumulative, ...)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="decode", help="the bench's decode or prefill row")
    parser.add_argument("--skewed", action="store_true", help="every token routes to rank 0's experts")
    parser.add_argument("--poll-ab", default="", help="poll settings to alternate, e.g. 0,auto,3000")
    parser.add_argument("--rounds", type=int, default=8, help="blocks per setting with --poll-ab")
    parser.add_argument("--barrier", action="store_true",
                        help="also time calls each after a barrier (gloo's or shm's), alone and after a baseline call")
    parser.add_argument("--sums", choices=["every", "live", "auto"], default=None,
                        help="a compiled live layout's combine sums (default: the module's)")
    parser.add_argument("--dump-tiers", default="", help="a folder for rank 0's compiled tiers' descriptions")
    args = parser.parse_args(argv)
    if args.sums:
        from pypto_rt.kernels.moe import dispatch
        dispatch.COMPILED_SUMS = args.sums
    torch.set_num_threads(1)
    _count_waits()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        rank, shape = dist.get_rank(), MoEShape(*SHAPES[args.shape], args.skewed)
        x, topk_idx, topk_weights = make_inputs(shape, dist.get_world_size(), rank)
        buf, call, _ = make_buffer(load_ours(), shape, x, topk_idx.int(), topk_weights, tier="eager")
        tiers = compile_tiers(call, buf)
        if args.dump_tiers and rank == 0:
            _dump_tiers(tiers, args.dump_tiers)
        run = tiered(call, buf, args.form == "compiled")
        per_call(run, 20)
        dist.barrier()
        wall, cpu, waits, process = per_call(run, args.calls)
        print(f"rank {rank} {args.form} ({', '.join(t['state'] for t in tiers)}): wall {wall:.3f} ms, "
              f"CPU {cpu:.3f} ms per call ({cpu - waits:.3f} ms outside the waits' polls; all threads "
              f"{process:.3f} ms), torch threads {torch.get_num_threads()}", flush=True)
        dist.barrier()
        if args.barrier:
            barriered(run, args.calls, rank, x, topk_idx, topk_weights)
        dist.barrier()
        if args.poll_ab:
            poll_ab(run, args.poll_ab.split(","), args.calls, args.rounds, rank)
        dist.barrier()
        if args.profile:
            text = profile(run, args.calls, sort=args.sort)
            if rank == 0:
                print(text, flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
