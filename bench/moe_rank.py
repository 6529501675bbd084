"""One rank of the MoE dispatch benchmark, started by `bench.moe_dispatch` through pypto-launch (comm shm).

`pypto-launch --nproc N bench/moe_rank.py --set quick --iters 50 --warmup 10 --out f.json` (what it runs)

Every rank joins one gloo process group (env://, the launcher's store) and, per shape, first checks each
contender against the single-process golden (an error names the rank, the shape and the contender), then times
them interleaved: every call is a gloo barrier and one timed dispatch+combine, the contenders taking turns in
blocks of calls (`time_interleaved`), with the expert step as identity (only communication is timed); then in runs
of consecutive calls, one barrier before each run (`time_consecutive`). "ours" is `pypto_rt.kernels.moe.MoEBuffer`,
constructed collectively per shape, when that name is importable; else the row says "not built yet". The calls per shape
stop at a time budget every rank agrees on (`plan_calls`). Rank 0 writes every rank's samples and counters to
`--out` as JSON.

`--tier eager` (PYPTO_TIER for MoEBuffer's calls, issue 17): each buffer is called until its replays are compiled
(eager: at the first replay; not timed), then "ours" is timed with every compiled tier swapped in and "ours
(replayed)" with the replays, interleaved with the baseline in the same iterations; the tiers' states and compile
times go to the results.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

from bench.moe_baseline import GlooDispatch
from bench.moe_routing import EXPERTS_PER_RANK, SETS, MoEShape, accounting, expert_fn, golden, make_inputs, \
    route_counts

GLOO_TIMEOUT_S = 120          # every gloo wait has this deadline (a peer that died ends the job sooner)
MIN_ITERS = 5                 # timed calls per contender and shape, whatever the time budget
NOT_BUILT = "not built yet"
INTERLEAVE_BLOCK = 5          # calls of one contender in a row (time_interleaved)
CONSECUTIVE_BURST = 10        # calls per run of consecutive calls (time_consecutive)
CONSECUTIVE_ROUNDS = 10       # at most this many runs per contender and shape


class ContenderMismatch(AssertionError):
    """A contender's output differs from the golden; the message names the rank, shape and contender."""


def load_ours():
    """(MoEBuffer, MoEConfig) when the library has MoEBuffer, else None."""
    try:
        from pypto_rt.kernels.moe import MoEBuffer, MoEConfig
    except ImportError:
        return None
    return MoEBuffer, MoEConfig


def _own_route_counts(shape: MoEShape) -> torch.Tensor:
    """[EXPERTS_PER_RANK] routes from every rank to this rank's experts (rebuilt from all ranks' routing)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return route_counts(shape, world).view(world, EXPERTS_PER_RANK)[rank]


def check_baseline(base: GlooDispatch, shape: MoEShape, x, topk_idx, topk_weights) -> None:
    """The baseline receives each local expert's global route count, and its combine of expert_fn's rows equals
    the golden bit for bit."""
    recv = base.dispatch(x, topk_idx, topk_weights)
    got, want = torch.bincount(recv.local_expert, minlength=EXPERTS_PER_RANK), _own_route_counts(shape)
    if not torch.equal(got, want):
        raise ContenderMismatch(f"rank {dist.get_rank()}: baseline received {got.tolist()} rows per local expert, "
                                f"not the global route counts {want.tolist()}, for {shape}")
    out = base.combine(expert_fn(recv.x, base.global_expert(recv)), recv.handle)
    ref = golden(x, topk_idx, topk_weights)
    if not torch.equal(out, ref):
        raise ContenderMismatch(f"rank {dist.get_rank()}: baseline output differs from the golden for {shape} "
                                f"(max abs diff {float((out.float() - ref.float()).abs().max()):g})")


def check_ours(buf, shape: MoEShape, x, topk_idx, topk_weights) -> int:
    """recv.counts are the global route counts of this rank's experts; combine matches the golden (bf16 tol).
    Returns the bytes of recv.x, the buffer's receive tensor."""
    rank = dist.get_rank()
    recv = buf.dispatch(x, topk_idx, topk_weights)
    want = _own_route_counts(shape)
    if not torch.equal(recv.counts.long(), want):
        raise ContenderMismatch(f"rank {rank}: MoEBuffer recv.counts {recv.counts.tolist()} != the global route "
                                f"counts {want.tolist()} for {shape}")
    ids = torch.arange(EXPERTS_PER_RANK) + rank * EXPERTS_PER_RANK
    y = expert_fn(recv.x, ids.view(-1, 1).expand(recv.x.shape[:2]))
    out, ref = buf.combine(y, recv.handle).float(), golden(x, topk_idx, topk_weights).float()
    try:
        torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1e-2 * max(1.0, float(ref.abs().max())))
    except AssertionError as e:
        raise ContenderMismatch(f"rank {rank}: MoEBuffer combine differs from the golden for {shape}: {e}") from None
    return recv.x.numel() * recv.x.element_size()


def stats_of(buf) -> dict | None:
    """The buffer's own counters (`buf.stats()`, a dict or dataclass) as a flat dict of scalars, or None."""
    stats = getattr(buf, "stats", None)
    if stats is None:
        return None
    value = stats() if callable(stats) else stats
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    elif not isinstance(value, dict):
        value = vars(value)
    return {k: v for k, v in value.items() if isinstance(v, (int, float, str, bool))}


def _slowest_rank(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def plan_calls(contenders: dict, iters: int, warmup: int, budget_s: float) -> tuple[int, int]:
    """(warm-up, timed) calls per contender within `budget_s` for the shape, judged by one first call of each on
    the slowest rank (so every rank agrees): the timed calls get 80% of it, at most `iters`, at least MIN_ITERS
    (or `iters` if fewer)."""
    start = time.perf_counter()
    for fn in contenders.values():
        fn()
    per_round = max(_slowest_rank(time.perf_counter() - start), 1e-6)
    timed = min(iters, max(MIN_ITERS, int(0.8 * budget_s / per_round)))
    return max(0, min(warmup - 1, int(0.2 * budget_s / per_round))), timed


def time_interleaved(contenders: dict, iters: int, warmup: int,
                     block: int = INTERLEAVE_BLOCK) -> tuple[dict[str, list[float]], dict[str, list[tuple]]]:
    """Seconds of each call, `iters` per contender, each call after a barrier, and each call's (entry, exit) on the
    host's monotonic clock (perf_counter: one clock for every process of a host, so the job's span of a call can be
    told); the contenders take turns in blocks of `block` calls, in the opposite order every other round. (One call
    each per round put every MoEBuffer call right after a gloo all_to_all, which slowed it by ~0.4 ms at 2-rank
    decode against one after its own kind: blocks leave that to a block's first call, and the order swap to either
    contender alike.)"""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    spans: dict[str, list[tuple]] = {name: [] for name in contenders}
    names = list(contenders)
    for first in range(0, iters, block):
        for name in (names if first // block % 2 == 0 else names[::-1]):
            fn = contenders[name]
            for _ in range(min(block, iters - first)):
                dist.barrier()
                start = time.perf_counter()
                fn()
                end = time.perf_counter()
                samples[name].append(end - start)
                spans[name].append((start, end))
    return samples, spans


def time_consecutive(contenders: dict, rounds: int, burst: int) -> dict[str, list[float]]:
    """Seconds per call of each contender in `rounds` runs of `burst` consecutive calls (one barrier before each
    run, none between its calls): the steady state of a step loop, as DeepEP's benchmark times its kernels. A
    barrier's sleep leaves a rank's next call slower (cold caches; ~0.4 ms on this 2-core host at decode sizes), which
    `time_interleaved` pays every call."""
    per_call: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(burst):
                fn()
            per_call[name].append((time.perf_counter() - start) / burst)
    return per_call


def make_buffer(ours, shape: MoEShape, x, topk_idx, topk_weights, tier: str = "off"):
    """A checked MoEBuffer for `shape` (collective), its timed call (dispatch, identity experts, combine) and the
    bytes of its receive tensor. `tier` eager: built under PYPTO_TIER=eager (a buffer picks its kernels by it)."""
    from pypto_rt import config

    buf_cls, cfg_cls = ours
    with config.scope(**({"TIER": "eager"} if tier == "eager" else {})):
        buf = buf_cls(cfg_cls(hidden=shape.hidden, num_experts=shape.num_experts(dist.get_world_size()),
                              top_k=shape.top_k, max_tokens_per_rank=shape.tokens, dtype=x.dtype))
    recv_bytes = check_ours(buf, shape, x, topk_idx, topk_weights)

    def call():
        recv = buf.dispatch(x, topk_idx, topk_weights)
        return buf.combine(recv.x, recv.handle)

    return buf, call, recv_bytes


def _specialisations(buf) -> list:
    """The replayed specialisations of the buffer's window kernels (none on other transports)."""
    from pypto_rt.kernels.moe.dispatch import (WindowTransport, combine_kernel, combine_reduce_kernel,
                                               combine_send_kernel, dispatch_kernel)

    if not isinstance(buf.transport, WindowTransport):
        return []
    combine = (combine_send_kernel(buf.layout), combine_reduce_kernel(buf.layout)) if buf.transport.split_combine \
        else (combine_kernel(buf.layout),)
    kernels = (dispatch_kernel(buf.layout), *combine)
    return [spec for k in kernels for spec in k.state.replay.values() if spec.tier is not None]


def compile_tiers(call, buf, calls: int = 4) -> list[dict]:
    """Call the buffer `calls` times with PYPTO_TIER=eager (every rank the same count: the calls are collective),
    enough for the engine runs, the recording and the capture call its replays are compiled from; its tiers."""
    from pypto_rt import config

    with config.scope(TIER="eager"):
        for _ in range(calls):
            call()
    return [{"entry": spec.tier.entry.split(".")[0], "state": spec.tier.state, "compile_s": spec.tier.compile_s,
             "text": spec.tier.text} for spec in _specialisations(buf)]


def tiered(call, buf, compiled: bool):
    """`call` with every compiled tier of the buffer's kernels swapped in (or the replays)."""
    def run():
        for spec in _specialisations(buf):
            if spec.tier.tiered is not None:
                spec.tier.chosen = spec.tier.tiered if compiled else spec.replay
        return call()
    return run


def replay_state(buf, x, topk_idx, topk_weights) -> dict:
    """How one more (untimed) call's dispatch and combine ran, by run_stats: {"dispatch": {"kind": "replayed" |
    "refused" | ..., "reason": ..., "host_reads": elements its host program read (None: the runtime does not count
    them)}, "combine": ...}; None for a call that ran no pypto kernel."""
    from pypto_rt import run_stats

    with run_stats.collect() as sent:
        recv = buf.dispatch(x, topk_idx, topk_weights)
    with run_stats.collect() as back:
        buf.combine(recv.x, recv.handle)
    return {name: {"kind": s.replay.kind, "reason": s.replay.reason, "host_reads": getattr(s, "host_reads", None)}
            if s.replay else None for name, s in (("dispatch", sent), ("combine", back))}


def ours_counters(buf, x, topk_idx, topk_weights) -> dict:
    """After the timed calls: the buffer's stats, the rows its latest dispatch sent per rank, the replay state."""
    sent_rows = getattr(buf, "sent_rows", None)
    return {"stats_after": stats_of(buf), "sent_rows": sent_rows() if sent_rows else None,
            "replay": replay_state(buf, x, topk_idx, topk_weights)}


def measure_shape(shape: MoEShape, iters: int, warmup: int, ours, budget_s: float = 60.0,
                  absent: str = NOT_BUILT, tier: str = "off") -> dict:
    """Check, then time, both contenders on one shape (at most `iters` timed calls each, fewer where they would
    take over `budget_s`); this rank's samples and counters. Without `ours`, its status says `absent`."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, topk_idx, topk_weights = make_inputs(shape, world, rank)
    base = GlooDispatch(EXPERTS_PER_RANK)
    check_baseline(base, shape, x, topk_idx, topk_weights)

    def baseline():
        recv = base.dispatch(x, topk_idx, topk_weights)
        return base.combine(recv.x, recv.handle)

    contenders, row = {"baseline": baseline}, {"status": absent}
    if ours is not None:
        idx32 = topk_idx.int()   # what the gate returns
        buf, contenders["ours"], recv_bytes = make_buffer(ours, shape, x, idx32, topk_weights, tier)
        row = {"status": "ok", "stats_before": stats_of(buf), "recv_bytes": recv_bytes}
        if tier == "eager":
            row["tiers"] = compile_tiers(contenders["ours"], buf)
            call = contenders["ours"]
            contenders["ours"], contenders["ours_replayed"] = tiered(call, buf, True), tiered(call, buf, False)
    base.host_reads = 0
    warmup, iters = plan_calls(contenders, iters, warmup, budget_s) if iters else (warmup, 0)
    samples, spans = time_interleaved(contenders, iters, warmup)
    # runs of consecutive calls: about twice the timed calls' count, 2 to CONSECUTIVE_ROUNDS runs
    rounds = max(2, min(CONSECUTIVE_ROUNDS, 2 * iters // CONSECUTIVE_BURST)) if iters else 0
    consecutive = time_consecutive(contenders, rounds, CONSECUTIVE_BURST)
    calls = int(bool(iters)) + warmup + iters + rounds * CONSECUTIVE_BURST   # per contender: the counters' divisor
    if ours is not None:
        row.update(ours_counters(buf, x, idx32, topk_weights))
        getattr(buf, "close", lambda: None)()    # one buffer per shape: free its windows if it can
    return {"shape": dataclasses.asdict(shape), "rank": rank, "calls": calls,
            "baseline": {"samples": samples["baseline"], "spans": spans["baseline"],
                         "consecutive": consecutive["baseline"], "host_reads": base.host_reads},
            "ours": {**row, "samples": samples.get("ours", []), "spans": spans.get("ours", []),
                     "consecutive": consecutive.get("ours", []), "replayed_samples": samples.get("ours_replayed")},
            "bytes": accounting(shape, world, rank)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/moe_rank.py", description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="quick", help="shape set (bench.moe_routing)")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per contender and shape")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per contender and shape first")
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="seconds per shape for warm-up and timed calls, both contenders (at least 5 calls)")
    parser.add_argument("--baseline-only", action="store_true", help="do not run MoEBuffer even if built")
    parser.add_argument("--out", required=True, help="rank 0 writes the JSON results here")
    parser.add_argument("--tier", choices=["off", "eager"], default="off",
                        help="eager: MoEBuffer's replays compiled (PYPTO_TIER), timed against its replays")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        ours = None if args.baseline_only else load_ours()
        absent = "not run (--baseline-only)" if args.baseline_only else NOT_BUILT
        mine = [measure_shape(s, args.iters, args.warmup, ours, args.budget_s, absent, args.tier)
                for s in SETS[args.set]]
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            with open(args.out + ".part", "w") as f:
                json.dump(everyone, f)
            os.replace(args.out + ".part", args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
