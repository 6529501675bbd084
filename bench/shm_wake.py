"""How late an shm wait returns after its peer signalled (issue 14's waits): the wake-up delay and a ping-pong.

    .venv/bin/pypto-launch --nproc N bench/shm_wake.py [--iters 200] [--work-us 300]
    PYPTO_SHM_BLOCK=0 .venv/bin/pypto-launch ...     # the yields and doubling sleeps instead of the futex

Wake-up delay: rank 0 waits; every other rank in turn busies itself `--work-us` (so the wait has given up its
spin), stamps CLOCK_MONOTONIC into the window and signals; rank 0 reads the clock when its wait returns. The
difference is what the wait adds after the signal (a sleep's overshoot, a wake-up's scheduling), per call.
Ping-pong: ranks 0 and 1 bounce a signal `--iters` times (the round trip of two signal-wait pairs).
With more ranks than cores the others are busy peers that also need a core.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import pypto.language.distributed as pld
from pypto_rt.collective import process

STAMP, CELLS = 64, 16     # int32 signal cells at [0, CELLS); int64 stamps from byte STAMP * 4 on, one per rank


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def wake_delays(comm, win, rank: int, world: int, iters: int, work_us: float) -> list[float]:
    """Rank 0: seconds from each peer's stamp to its wait's return."""
    stamps = win.peer(0)[STAMP * 4:STAMP * 4 + 8 * world].view(torch.int64)
    delays = []
    for i in range(1, iters + 1):
        for src in range(1, world):
            if rank == src:
                _busy(work_us)
                stamps[src] = time.monotonic_ns()
                comm.notify(win, 0, src * 4, i, "set")
            elif rank == 0:
                comm.wait(win, src * 4, i, "ge", label="wake")
                delays.append((time.monotonic_ns() - int(stamps[src])) * 1e-9)
        comm.barrier()
    return delays


def ping_pong(comm, win, rank: int, iters: int) -> float:
    """Median seconds of one round trip between ranks 0 and 1 (cell 0 on rank 1: ping; on rank 0: pong)."""
    trips = []
    for i in range(1, iters + 1):
        start = time.perf_counter()
        if rank == 0:
            comm.notify(win, 1, 0, i, "set")
            comm.wait(win, 0, i, "ge", label="pong")
        elif rank == 1:
            comm.wait(win, 0, i, "ge", label="ping")
            comm.notify(win, 0, 0, i, "set")
        trips.append(time.perf_counter() - start)
    return statistics.median(trips)


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/shm_wake.py", description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--work-us", type=float, default=300.0)
    args = ap.parse_args()
    rank, world = pld.rank(), pld.world_size()
    comm = process.communicator("bench/shm_wake.py")
    win = comm.alloc_window(4096, "wake")
    mode = "futex" if getattr(comm, "_futex", False) else "yield+sleep"
    delays = wake_delays(comm, win, rank, world, args.iters, args.work_us)
    comm.barrier()
    trip = ping_pong(comm, win, rank, args.iters) if world > 1 else 0.0
    comm.barrier()
    if rank == 0:
        delays.sort()
        print(f"{world} ranks, {mode}: wake-up after the signal median {statistics.median(delays) * 1e6:.0f} us, "
              f"p90 {delays[int(0.9 * len(delays))] * 1e6:.0f} us over {len(delays)}; ping-pong round trip median "
              f"{trip * 1e6:.0f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
