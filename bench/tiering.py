"""Benchmark 16 - the compiled tier (PYPTO_TIER, replay.tier): each conformance kernel (c01..c07) replayed and
compiled, against its torch golden in steady state (one torch thread), with the compile time and the calls after
which compiling pays for itself."""
from __future__ import annotations

import time

import torch

from bench import conformance
from bench.timing import geomean, interleaved, ratio, table, verdict

TITLE = "16. Compiled tier: conformance kernels compiled by inductor against their torch goldens"
TARGET, WORST = 1.0, 1.5


def _force(entry, compiled: bool) -> bool:
    """Make every call of `entry`'s specialisations run the compiled function (or the replay); False when a
    specialisation has no compiled one."""
    found = True
    for spec in getattr(entry, "kernel", entry).state.replay.values():
        tier = spec.tier
        if tier is None or (compiled and tier.tiered is None):
            found = False
            continue
        tier.chosen = tier.tiered if compiled else spec.replay
    return found


def measure(case, repeats: int) -> dict:
    from pypto_rt import config
    from pypto_rt.replay.policy import policy_scope
    from pypto_rt.replay.tier import tiers

    with config.scope(TIER="eager", EXECUTOR="compiled"), policy_scope(tier_trial_calls=1 << 30):
        t0 = time.perf_counter()
        for _ in range(8):   # engine runs, the recording, the first replay (which compiles)
            case.run_entry()
        warm_s = time.perf_counter() - t0
        found = tiers(case.entry)
        compile_s = sum(t.compile_s for t in found)
        why = "; ".join(t.why for t in found if t.tiered is None and t.why) or "no replay"
        compiled = bool(found) and _force(case.entry, True)

        def mode(compiled):
            def call():
                _force(case.entry, compiled)
                case.run_entry()
            return call
        contenders = {"replayed": mode(False), "golden": case.run_golden}
        if compiled:
            contenders["compiled"] = mode(True)
        t = interleaved(contenders, repeats)
    t.update(compile_s=compile_s, warm_s=warm_s, why=why)
    return t


def run(repeats: int = 15) -> str:
    rows, compiled_ratios, best_ratios = [], [], []
    for path in conformance.paths():
        case = conformance.case(path)
        torch.set_num_threads(1)
        t = measure(case, repeats)
        rr = t["replayed"] / t["golden"]
        if "compiled" not in t:
            best_ratios.append(rr)
            rows.append([case.name, "-", ratio(rr), ratio(rr), f"{t['compile_s']:.1f} s", "-",
                         f"kept as a replay: {t['why'][:160]}"])
            continue
        rc = t["compiled"] / t["golden"]
        saved = t["replayed"] - t["compiled"]
        pays = f"{t['compile_s'] / saved:,.0f}" if saved > 0 else "never"
        compiled_ratios.append(rc)
        best_ratios.append(min(rc, rr))
        rows.append([case.name, ratio(rc), ratio(rr), ratio(min(rc, rr)), f"{t['compile_s']:.1f} s", pays,
                     f"golden {t['golden'] * 1e3:.3f} ms"])
    gc = geomean(compiled_ratios) if compiled_ratios else float("nan")
    gb = geomean(best_ratios) if best_ratios else float("nan")
    rows.append(["**geometric mean**", f"**{ratio(gc)}** (compiled ones)", "-", f"**{ratio(gb)}** (all)", "-", "-",
                 "-"])
    return "\n".join([
        table(["kernel", "compiled / golden", "replayed / golden", "kept (faster) / golden", "compile time",
               "calls to pay back the compile", "note"], rows), "",
        f"Target: geometric mean of the kept tier ≤ {TARGET:g}x: {verdict(gb, TARGET)} ({ratio(gb)}); kernels "
        f"within {WORST:g}x: {sum(r <= WORST for r in best_ratios)}/{len(best_ratios)}. The trial keeps "
        "the faster of compiled and replayed per specialisation ('kept'). Compile time: make_fx + inductor's "
        "compile_fx + the check against the replay, on a cold inductor cache unless an earlier run filled it."])
