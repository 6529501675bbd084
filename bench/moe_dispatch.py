"""Benchmark 9 - MoE dispatch+combine (issue 14): `pypto_rt.kernels.moe.MoEBuffer` on the shm communicator against
a Megatron-style baseline on torch.distributed gloo (`bench.moe_baseline`), in the same rank processes, interleaved.

Each world size is one pypto-launch job (`bench/moe_rank.py`, comm shm) whose ranks also join a gloo group. Per
shape every rank checks each contender against the golden first, then times them interleaved (barrier, one
dispatch+combine, identity expert step). A call's latency is that of its slowest rank (the round trip ends when
the last rank has its output); the table gives the median and p90 over iterations, and beside it the median span
from the call's last rank's entry to its last rank's exit (the barrier's release stagger left out), and the time per
call in runs of consecutive calls. Logical GB/s is DeepEP's: 2H
bytes per selected (token, expert) pair, both directions, per rank, over the median. Wire bytes against live-row
bytes (unique (token, destination rank) pairs) are summed over ranks; MoEBuffer's come from `buf.stats()` when
it has one, else from the rows its `sent_rows()` reports. Receive buffer: the baseline's largest rank's dispatch
receive; MoEBuffer's `recv.x`. The last column says how a repeated MoEBuffer call ran (pypto_rt.run_stats).

`python -m bench.moe_dispatch [--full | --set prefill|decode|full-decode] [--worlds 2,4,8] [--iters N] [--budget-s S] [--tier eager]`
prints the tables on their own; `--full` runs every shape (decode T=8, T=128 and prefill T=1024, uniform and
skewed; about 10 minutes on 2 cores), `--set prefill` the prefill ones, `--set decode` /
`full-decode` the decode ones of the quick / full set. Each shape's calls stop at a time budget
(at least 5 timed calls each), so a slow contender cannot stall the suite. `--tier eager` compiles MoEBuffer's
replays on every rank (PYPTO_TIER, issue 17) and times its compiled calls against its replayed ones, interleaved
with the baseline (a third table, with build times).
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from bench.moe_rank import CONSECUTIVE_BURST
from bench.moe_routing import EXPERTS_PER_RANK, MoEShape
from bench.timing import dur, ratio, table, verdict

TITLE = "10. MoE dispatch+combine: MoEBuffer (shm) vs a Megatron-style gloo baseline"
RANK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_rank.py")
TARGETS = {"decode": 2.0, "prefill": 1.2}   # issue 14: speed-up over the baseline
WIRE_KEYS = ("bytes_sent", "wire_bytes")      # MoEBuffer.stats() names tried for bytes on the wire
HOST_READ_KEYS = ("host_reads",)
JOB_TIMEOUT_S = 120                           # the ranks' no-progress deadline (pypto-launch --timeout-s)


def run_world(world: int, shape_set: str, iters: int, warmup: int, baseline_only: bool = False,
              budget_s: float = 60.0, tier: str = "off") -> list[list[dict]]:
    """One launched job of `world` ranks; every rank's rows (rank-major). Raises RuntimeError if a rank failed."""
    from pypto_rt.launch import launch

    with tempfile.TemporaryDirectory(prefix="moe-bench-") as tmp:
        out = os.path.join(tmp, "results.json")
        args = ["--set", shape_set, "--iters", iters, "--warmup", warmup, "--budget-s", budget_s, "--out", out,
                "--tier", tier]
        result = launch(RANK_PROGRAM, *args, *(["--baseline-only"] if baseline_only else []), nproc=world,
                        comm="shm", log_dir=os.path.join(tmp, "logs"), timeout_s=JOB_TIMEOUT_S)
        if not result.passed:
            raise RuntimeError(f"bench.moe_dispatch: the {world}-rank job failed:\n{result.report}")
        with open(out) as f:
            return json.load(f)


def latency(rows: list[dict], who: str, key: str = "samples") -> tuple[float, float] | None:
    """(median, p90) over iterations of the slowest rank's seconds per call (`key` consecutive: per call of each run
    of consecutive calls); None without samples."""
    per_rank = [r[who].get(key) or [] for r in rows]
    if not per_rank[0]:
        return None
    slowest = [max(calls) for calls in zip(*per_rank)]
    p90 = statistics.quantiles(slowest, n=10)[-1] if len(slowest) > 1 else slowest[0]
    return statistics.median(slowest), p90


def from_last_entry(rows: list[dict], who: str) -> float | None:
    """Median over iterations of the job's seconds per call from its last rank's entry to its last rank's exit (one
    monotonic clock for the host's processes): the call's own span, without the barrier's stagger (a gloo barrier
    on oversubscribed cores releases 8 ranks over milliseconds; the rank out first waits in the call for the rest,
    which the slowest rank's own time counts); None without spans."""
    per_rank = [r[who].get("spans") or [] for r in rows]
    if not per_rank[0]:
        return None
    return statistics.median(max(end for _, end in call) - max(start for start, _ in call) for call in zip(*per_rank))


def ours_counter(rows: list[dict], keys: tuple[str, ...], over=sum) -> float | None:
    """Per call, `over` the ranks (sum, max): the first of `keys` MoEBuffer.stats() has, over the timed calls."""
    per_rank = []
    for r in rows:
        before, after = r["ours"].get("stats_before") or {}, r["ours"].get("stats_after") or {}
        key = next((k for k in keys if k in after), None)
        if key is None:
            return None
        per_rank.append((after[key] - before.get(key, 0)) / max(1, r["calls"]))
    return over(per_rank)


def ours_wire(rows: list[dict]) -> tuple[float, str] | None:
    """MoEBuffer's bytes on the wire per call, summed over ranks, and where the figure comes from: its stats(),
    else the token rows its `sent_rows()` says each dispatch sent (as many return in the combine); None: neither."""
    wire = ours_counter(rows, WIRE_KEYS)
    if wire is not None:
        return wire, "stats()"
    if any(r["ours"].get("sent_rows") is None for r in rows):
        return None
    row_bytes = MoEShape(**rows[0]["shape"]).row_bytes()
    return 2 * sum(sum(r["ours"]["sent_rows"]) for r in rows) * row_bytes, "payload rows, sent_rows()"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _timing_row(rows: list[dict], world: int) -> list:
    shape = rows[0]["shape"]
    base, ours = latency(rows, "baseline"), latency(rows, "ours")
    logical = rows[0]["bytes"]["logical"]
    cells = [world, _label(shape), _routing(shape), len(rows[0]["baseline"]["samples"]),
             f"{dur(base[0])} / {dur(base[1])}", f"{logical / base[0] / 1e9:.2f}"]
    if ours is None:
        return cells + [rows[0]["ours"]["status"], "-", "-", "-", "-", "-", "-"]
    speedup, target = base[0] / ours[0], TARGETS[shape["phase"]]
    cells += [f"{dur(ours[0])} / {dur(ours[1])}", f"{logical / ours[0] / 1e9:.2f}", ratio(speedup),
              f"≥ {target:g}x: {verdict(speedup, target, higher_is_better=True)}"]
    base_span, ours_span = from_last_entry(rows, "baseline"), from_last_entry(rows, "ours")
    if base_span is None or ours_span is None:
        cells += ["-"]
    else:
        cells += [f"{dur(base_span)} / {dur(ours_span)}: {ratio(base_span / ours_span)}"]
    base_run, ours_run = latency(rows, "baseline", "consecutive"), latency(rows, "ours", "consecutive")
    if base_run is None or ours_run is None:
        return cells + ["-", "-"]
    steady = base_run[0] / ours_run[0]
    return cells + [f"{dur(base_run[0])} / {dur(ours_run[0])}: {ratio(steady)}",
                    f"≥ {target:g}x: {verdict(steady, target, higher_is_better=True)}"]


def _bytes_row(rows: list[dict], world: int) -> list:
    shape = rows[0]["shape"]
    live = sum(r["bytes"]["live"] for r in rows)
    base_wire = sum(r["bytes"]["baseline_wire"] for r in rows)
    base_reads = rows[0]["baseline"]["host_reads"] / max(1, rows[0]["calls"])
    built = rows[0]["ours"]["status"] == "ok"
    wire = ours_wire(rows)
    wire_cell = ("-" if not built else f"{wire[0] / live:.2f}x ({wire[1]})" if wire is not None
                 else "n/a (no counter)")
    return [world, _label(shape), _routing(shape), _mib(rows[0]["bytes"]["logical"]),
            f"{base_wire / live:.2f}x", wire_cell, f"{base_reads:g}", _ours_reads(rows) if built else "-",
            _mib(max(r["bytes"]["baseline_recv"] for r in rows)),
            _mib(max(r["ours"]["recv_bytes"] for r in rows)) if built else "-",
            _replay_cell(rows[0]["ours"].get("replay"))]


def _ours_reads(rows: list[dict]) -> str:
    """Host reads per call on the busiest rank: stats()'s, else the kernels' host programs' (run_stats)."""
    reads = ours_counter(rows, HOST_READ_KEYS, over=max)
    if reads is not None:
        return f"{reads:g} (stats())"
    calls = [call for r in rows for call in (r["ours"].get("replay") or {}).values()]
    if not calls or any(call is None or call["host_reads"] is None for call in calls):
        return "n/a (no counter)"
    busiest = max(sum(c["host_reads"] for c in (r["ours"]["replay"] or {}).values()) for r in rows)
    return f"{busiest} (host program)"


def _replay_cell(replay: dict | None) -> str:
    if not replay:
        return "-"
    return " / ".join(call["kind"] if call else "-" for call in replay.values())


def _replay_notes(worlds: dict[int, list[list[dict]]]) -> list[str]:
    """One line per distinct reason a MoEBuffer call did not replay."""
    reasons = {}
    for ranks in worlds.values():
        for row in ranks[0]:
            for name, call in (row["ours"].get("replay") or {}).items():
                if call and call["kind"] != "replayed" and call["reason"]:
                    reasons.setdefault(f"{name}: {call['kind']}: {call['reason']}", None)
    return [f"- MoEBuffer {reason}" for reason in reasons]


def _label(shape: dict) -> str:
    return f"{shape['phase']} T={shape['tokens']} H={shape['hidden']} k={shape['top_k']} E={EXPERTS_PER_RANK}·R"


def _routing(shape: dict) -> str:
    return "skewed" if shape["skewed"] else "uniform"


def _tier_row(rows: list[dict], world: int) -> list | None:
    """Compiled against replayed MoEBuffer calls (--tier eager), or None when the shape was not run so."""
    if not rows[0]["ours"].get("replayed_samples"):
        return None
    shape = rows[0]["shape"]
    base, compiled = latency(rows, "baseline"), latency(rows, "ours")
    replayed = latency([{"ours": {"samples": r["ours"]["replayed_samples"]}} for r in rows], "ours")
    built = {}
    for r in rows:
        for t in r["ours"].get("tiers", []):
            built.setdefault(t["entry"], []).append(f"{t['state']} {t['compile_s']:.1f} s")
    return [world, _label(shape), _routing(shape), f"{dur(compiled[0])} / {dur(compiled[1])}",
            f"{dur(replayed[0])} / {dur(replayed[1])}", ratio(replayed[0] / compiled[0]),
            ratio(base[0] / compiled[0]), "; ".join(f"{e}: {', '.join(v)}" for e, v in built.items()) or "-"]


def report(worlds: dict[int, list[list[dict]]]) -> str:
    """The two tables (time, bytes) over every world size and shape."""
    timing, nbytes, tiers = [], [], []
    for world, ranks in worlds.items():
        for rows in zip(*ranks):      # one shape: every rank's row
            timing.append(_timing_row(list(rows), world))
            nbytes.append(_bytes_row(list(rows), world))
            tiers.append(_tier_row(list(rows), world))
    tier_table = [] if not any(tiers) else [
        table(["ranks", "shape (per rank)", "routing", "MoEBuffer compiled median / p90", "replayed median / p90",
               "compiled speed-up over replayed", "baseline / compiled",
               "tiers per entry, each rank (state, build time)"], [t for t in tiers if t]), ""]
    return "\n".join([
        table(["ranks", "shape (per rank)", "routing", "timed calls", "baseline median / p90", "baseline GB/s",
               "MoEBuffer median / p90", "MoEBuffer GB/s", "speed-up (baseline / ours)", "target",
               "from the last rank's entry: baseline / ours (median), speed-up",
               "consecutive calls: baseline / ours per call (median run), speed-up", "target (consecutive)"],
              timing), "",
        table(["ranks", "shape (per rank)", "routing", "logical bytes per rank", "baseline wire / live",
               "MoEBuffer wire / live", "baseline host reads per call", "MoEBuffer host reads per call (busiest rank)",
               "baseline receive buffer (largest rank)", "MoEBuffer recv.x",
               "MoEBuffer repeated call (dispatch / combine)"], nbytes), "", *tier_table,
        "Skewed: every token of every rank routes to rank 0's experts. Live rows: unique (token, destination rank) "
        "pairs, each way; the baseline sends one row per selected (token, expert) pair, plus [E] int64 counts. "
        "Latency is the slowest rank's per call (barrier before each call); GB/s is logical bytes per rank / median. "
        "From the last rank's entry: the same calls, each from the moment its last rank entered it to the moment its "
        "last rank left it (the host's one monotonic clock), so the barrier's release stagger is not in it. "
        f"Consecutive calls: runs of {CONSECUTIVE_BURST} calls with one barrier before each run (the steady state of "
        "a step loop, how DeepEP times its kernels); the slowest rank's time per call, median over the runs.",
        *_replay_notes(worlds)])


def run(worlds=(2, 4, 8), full: bool = False, iters: int | None = None, budget_s: float | None = None,
        tier: str = "off", shape_set: str | None = None) -> str:
    shape_set = shape_set or ("full" if full else "quick")
    iters, warmup = iters or (50 if full else 20), 10 if full else 3
    budget_s = budget_s or (25.0 if full else 15.0)
    results = {world: run_world(world, shape_set, iters, warmup, budget_s=budget_s, tier=tier) for world in worlds}
    cores = os.cpu_count() or 1
    note = (f"Up to {iters} timed calls per contender after up to {warmup} warm-up, per shape; fewer where a shape "
            f"would take over {budget_s:g} s (at least 5). Worlds above {cores} ranks oversubscribe this machine's "
            f"{cores} cores: those figures are scheduling-bound.")
    return f"{note}\n\n{report(results)}"


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.moe_dispatch", description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4,8", help="comma-separated rank counts (default 2,4,8)")
    parser.add_argument("--full", action="store_true", help="every shape (decode T=8/128, prefill T=1024)")
    parser.add_argument("--set", dest="shape_set", default=None,
                        choices=["quick", "full", "prefill", "decode", "full-decode"],
                        help="a shape set of bench.moe_routing (prefill: T=1024 uniform and skewed; decode: T=8)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per contender (default 20; --full 50)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds per shape, both contenders (default 15; --full 25)")
    parser.add_argument("--tier", choices=["off", "eager"], default="off",
                        help="eager: MoEBuffer's replays compiled on every rank, timed against its replays")
    args = parser.parse_args()
    start = time.perf_counter()
    body = run(tuple(int(w) for w in args.worlds.split(",")), args.full, args.iters, args.budget_s, args.tier,
               args.shape_set)
    print(f"## {TITLE}\n\n{body}\n\n"
          f"_(moe_dispatch: {time.perf_counter() - start:.1f} s)_")
