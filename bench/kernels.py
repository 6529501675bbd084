"""Benchmark 3 - each conformance kernel (c01..c07) on the compiled and the reference executor, against its torch
golden on the same inputs (torch threads = 1 on the calling thread; compiled workers set their own count)."""
from __future__ import annotations

import torch

from bench import conformance
from bench.timing import geomean, interleaved, ratio, table, verdict

TITLE = "3. Conformance kernels against their torch goldens"
TARGET = 3.0
# The real PyPTO compiler's torch_codegen CPU path, time / golden time (context, not a target)
PEERS = {"hello_world": 2.8, "softmax": 8.9, "rms_norm": 6.2, "layer_norm": 2.7, "matmul": 8.2}
NEAREST_PEER = {"c01_masked_softmax": "softmax", "c02_matmul_bf16_bt": "matmul", "c03_rmsnorm_dynamic": "rms_norm",
                "c05_layernorm_program": "layer_norm"}


def measure(case, repeats):
    from pypto_rt import config

    def on(executor):
        def call():
            with config.scope(EXECUTOR=executor):
                case.run_entry()
        return call

    return interleaved({"compiled": on("compiled"), "reference": on("reference"), "golden": case.run_golden},
                       repeats)


def run(repeats: int = 15) -> str:
    rows, compiled_ratios, reference_ratios = [], [], []
    for path in conformance.paths():
        case = conformance.case(path)
        torch.set_num_threads(1)  # importing pypto_rt.golden set the harness's own count
        t = measure(case, repeats)
        rc, rr = t["compiled"] / t["golden"], t["reference"] / t["golden"]
        compiled_ratios.append(rc)
        reference_ratios.append(rr)
        peer = NEAREST_PEER.get(case.name)
        rows.append([case.name, ratio(rc), ratio(rr), ratio(t["compiled"] / t["reference"]),
                     f"{t['golden'] * 1e3:.3f} ms", f"{ratio(PEERS[peer])} ({peer})" if peer else "-"])
    gc, gr = geomean(compiled_ratios), geomean(reference_ratios)
    rows.append(["**geometric mean**", f"**{ratio(gc)}**", f"**{ratio(gr)}**", ratio(gc / gr), "-",
                 f"{ratio(geomean(PEERS.values()))} (all five)"])
    peers = ", ".join(f"{name} {ratio(v)}" for name, v in PEERS.items())
    return "\n".join([
        table(["kernel", "compiled / golden", "reference / golden", "compiled / reference", "golden time",
               "PyPTO torch_codegen CPU / golden (nearest)"], rows), "",
        f"Target: compiled geometric mean ≤ {TARGET:g}x: {verdict(gc, TARGET)} ({ratio(gc)}); "
        f"kernels within {TARGET:g}x: {sum(r <= TARGET for r in compiled_ratios)}/{len(compiled_ratios)}.",
        f"Peer numbers (real PyPTO compiler, torch_codegen CPU path, its own kernels): {peers}."])
