"""Benchmark 6 - host collectives on one machine: the shm communicator against torch.distributed gloo doing the
same collective directly, in the same rank processes, interleaved.

Each world size gets fresh rank processes (`python -m bench.collectives --child`) sharing a parent-hosted
TCPStore; every rank holds both an shm communicator and a gloo process group. A sample is a fixed number of
back-to-back calls (the same on every rank, so calls pair up), preceded by a gloo barrier; each repeat samples shm
then gloo. A rank's figure is its median; the reported figure is the slowest rank's (a collective ends when its
last rank does). Sizes are bytes per rank: allreduce's tensor, allgather's input, all_to_all_v's live rows sent
(uneven splits, out of a buffer with twice that capacity). Bandwidth = those bytes / time. torch threads = 1.
Worlds above 2 ranks time only the end sizes (1 KiB, 16 MiB). `python -m bench.collectives [--worlds 2,4,8]
[--quick]` prints the table on its own.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from bench.timing import dur, ratio, table, verdict

TITLE = "6. Host collectives on one machine: shm communicator vs torch.distributed gloo"
SIZES = ((1 << 10, "1 KiB", 100, 7), (1 << 16, "64 KiB", 50, 7), (1 << 20, "1 MiB", 10, 7),
         (1 << 24, "16 MiB", 2, 5))          # bytes, label, calls per sample, repeats
SMALL_SLACK, LARGE_SPEEDUP = 1.5, 2.0       # shm at most 1.5x slower than gloo at 1 KiB, 2x faster at 16 MiB
OPS = ("allreduce", "allgather", "all_to_all_v")


def _splits(world: int, rows: int, rank: int) -> list[int]:
    """Uneven rows per destination summing to `rows` (rank-dependent, never all equal)."""
    weights = [1 + (rank + p) % world for p in range(world)]
    counts = [rows * w // sum(weights) for w in weights]
    counts[-1] += rows - sum(counts)
    return counts


def _contenders(op: str, nbytes: int, comm, rank: int, world: int):
    import torch
    import torch.distributed as dist

    n = nbytes // 4
    if op == "allreduce":
        t = torch.ones(n)
        return lambda: comm.allreduce(t), lambda: dist.all_reduce(t)
    if op == "allgather":
        inp, out = torch.ones(n), torch.empty(world, n)
        return (lambda: comm.allgather(out, inp),
                lambda: dist.all_gather_into_tensor(out.view(-1), inp))
    row = 16   # floats per row: 64-byte rows
    rows = max(world, n // row)
    send = _splits(world, rows, rank)
    recv = [_splits(world, rows, r)[rank] for r in range(world)]
    inp, out = torch.ones(2 * rows, row), torch.empty(2 * rows + sum(recv), row)
    live_in, live_out = inp[:sum(send)], out[:sum(recv)]
    return (lambda: comm.all_to_all_v(out, inp, send, recv),
            lambda: dist.all_to_all_single(live_out, live_in, output_split_sizes=recv, input_split_sizes=send))


def _sample(fn, calls: int) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def child(rank: int, world: int, port: int, prefix: str, quick: bool) -> None:
    import torch
    import torch.distributed as dist

    from pypto_rt.collective import create_communicator

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo/", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    comm = create_communicator("shm", rank, world, store=store, prefix=prefix, owner_unlinks=True,
                               timeout_s=120)
    results: dict = {"rank": rank}
    sizes = SIZES[:1] + SIZES[-1:] if quick else SIZES
    for op in OPS:
        for nbytes, label, calls, repeats in sizes:
            shm, gloo = _contenders(op, nbytes, comm, rank, world)
            shm(), gloo()   # warm-up (staging growth, gloo buffers)
            samples = {"shm": [], "gloo": []}
            for _ in range(repeats):
                samples["shm"].append(_sample(shm, calls))
                samples["gloo"].append(_sample(gloo, calls))
            results[f"{op}/{label}"] = {k: statistics.median(v) for k, v in samples.items()}
    bar = {"shm": [], "gloo": []}
    for _ in range(7):
        bar["shm"].append(_sample(comm.barrier, 200))
        bar["gloo"].append(_sample(dist.barrier, 200))
    results["barrier"] = {k: statistics.median(v) for k, v in bar.items()}
    for nbytes, label in ((1 << 16, "64 KiB"), (1 << 24, "16 MiB")):
        win = comm.alloc_window(nbytes, "bench")
        peer = (rank + 1) % world
        remote, local = (lambda: comm.remote_load(win, peer, 0, nbytes)), (lambda: win.local.clone())
        got = {"remote_load": [], "local clone": []}
        for _ in range(7):
            got["remote_load"].append(_sample(remote, 20 if nbytes < 1 << 20 else 3))
            got["local clone"].append(_sample(local, 20 if nbytes < 1 << 20 else 3))
        results[f"remote_load/{label}"] = {k: statistics.median(v) for k, v in got.items()}
    comm.close()
    dist.destroy_process_group()
    print(json.dumps(results))


def _run_world(world: int, quick: bool) -> list[dict]:
    import secrets

    import torch.distributed as dist

    from pypto_rt.collective import remove_segments

    prefix = f"pypto-bench-{os.getpid()}-{secrets.token_hex(3)}"
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    procs = [subprocess.Popen([sys.executable, "-m", "bench.collectives", "--child", str(r), str(world),
                               str(store.port), prefix] + (["--quick"] if quick else []),
                              env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
        remove_segments(prefix)
    failed = [(r, o[1][-2000:]) for r, (p, o) in enumerate(zip(procs, outs)) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"bench.collectives rank {failed[0][0]} failed:\n{failed[0][1]}")
    return [json.loads(o[0].strip().splitlines()[-1]) for o in outs]


def _slowest(ranks: list[dict], key: str, who: str) -> float:
    return max(r[key][who] for r in ranks)


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s"


def _collective_rows(ranks: list[dict], sizes) -> list[list]:
    rows = []
    for op in OPS:
        for nbytes, label, _, _ in sizes:
            key = f"{op}/{label}"
            shm, gloo = _slowest(ranks, key, "shm"), _slowest(ranks, key, "gloo")
            if nbytes == SIZES[0][0]:
                target = f"≤ {SMALL_SLACK:g}x slower: {verdict(shm / gloo, SMALL_SLACK)}"
            elif nbytes == SIZES[-1][0]:
                target = f"≥ {LARGE_SPEEDUP:g}x faster: {verdict(gloo / shm, LARGE_SPEEDUP, higher_is_better=True)}"
            else:
                target = "-"
            rows.append([op, label, dur(shm), _gbps(nbytes, shm), dur(gloo), _gbps(nbytes, gloo),
                         ratio(gloo / shm), target])
    return rows


def run(worlds=(2, 4, 8), quick: bool = False) -> str:
    out = []
    for world in worlds:
        brief = quick or world > 2   # more ranks than cores: the two end sizes are enough to see the trend
        sizes = SIZES[:1] + SIZES[-1:] if brief else SIZES
        ranks = _run_world(world, brief)
        note = "" if world <= (os.cpu_count() or 1) else (
            f" ({world} ranks on {os.cpu_count()} cores: ranks wait for a core, so these figures are noisy and "
            "scheduling-bound; ratios at 2 ranks are the ones to read)")
        out += [f"**{world} ranks**{note}", "",
                table(["collective", "bytes per rank", "shm", "shm bandwidth", "gloo", "gloo bandwidth",
                       "shm speed-up (gloo / shm)", "target"], _collective_rows(ranks, sizes)), ""]
        b_shm, b_gloo = _slowest(ranks, "barrier", "shm"), _slowest(ranks, "barrier", "gloo")
        load_rows = []
        for label, nbytes in (("64 KiB", 1 << 16), ("16 MiB", 1 << 24)):
            key = f"remote_load/{label}"
            remote, local = _slowest(ranks, key, "remote_load"), _slowest(ranks, key, "local clone")
            load_rows.append([f"remote_load {label} vs clone of the local window", dur(remote),
                              _gbps(nbytes, remote), dur(local), _gbps(nbytes, local), ratio(remote / local)])
        out += [table(["operation", "shm", "shm bandwidth", "reference", "reference bandwidth", "shm / reference"],
                      [["barrier (shm) vs dist.barrier (gloo)", dur(b_shm), "-", dur(b_gloo), "-",
                        ratio(b_shm / b_gloo)]] + load_rows), ""]
    out.append("shm collectives stage into shared memory, meet at one shared-memory barrier and read peers' "
               "staging directly; gloo moves the same bytes over loopback TCP. remote_load is a copy out of a "
               "peer's mapped window, so it should cost about what copying local memory does.")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], "--quick" in sys.argv)
    else:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m bench.collectives", description=__doc__.splitlines()[0])
        parser.add_argument("--worlds", default="2,4,8", help="comma-separated rank counts (default 2,4,8)")
        parser.add_argument("--quick", action="store_true", help="only 1 KiB and 16 MiB")
        args = parser.parse_args()
        start = time.perf_counter()
        print(f"## {TITLE}\n\n{run(tuple(int(w) for w in args.worlds.split(',')), args.quick)}\n\n"
              f"_(collectives: {time.perf_counter() - start:.1f} s)_")
