"""Benchmark 17 - the fixed cost of a replayed `@pl.jit` call: what a call costs beyond its recorded torch calls.

Two kernels with one 8x8 add as their body, `add_one_tile` (2 tensor arguments, a conformance kernel's size) and
`add_one_of_16` (16 tensor arguments, a serving kernel's weights, caches and tables), compiled executor, called
past their recording and trial. Contenders (interleaved; the fastest of many short samples, since a fixed cost is a
floor that a busy machine only adds to, as timeit advises): the plain call (`fn(*tensors)`: the fast path,
replay.arguments), the same call with keyword arguments (bound first, then replayed: what a call pays when the
fast path does not apply), and the recorded function alone on the same tensors (the torch calls themselves, on
the worker thread count). Fixed cost = call - recorded function. Targets (issue 17): <= 6 µs for the conformance
kernel, <= 15 µs for a serving kernel.
"""
from __future__ import annotations

import torch

from bench import jit_kernels as k
from bench.timing import interleaved, table, us, verdict

TITLE = "17. Fixed cost of a replayed @pl.jit call (2 and 16 tensor arguments)"
TARGETS = {2: 6e-6, 16: 15e-6}
WARM_UP_CALLS = 16   # past the engine runs, the recording and the trial


def _contenders(kernel, tensors: list, names: list) -> dict:
    from pypto_rt.replay.entry import decisions
    for _ in range(WARM_UP_CALLS):
        kernel(*tensors)
    assert decisions(kernel)[0].kind == "replayed", decisions(kernel)
    spec = next(s for s in kernel.state.replay.values() if s.replay is not None)
    keywords = dict(zip(names, tensors))
    return {"call": lambda: kernel(*tensors), "bound": lambda: kernel(**keywords),
            "recorded": lambda: spec.replay(*tensors)}


def run(repeats: int = 300) -> str:
    from pypto_rt import config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # (the recorded function alone runs on the worker thread count, as a replay does)
    rows = []
    try:
        with config.scope(EXECUTOR="compiled"):
            for kernel, count in ((k.add_one_tile, 2), (k.add_one_of_16, 16)):
                tensors = [torch.randn(k.TILE, k.TILE) for _ in range(count - 1)] + [torch.empty(k.TILE, k.TILE)]
                names = list(kernel.fn.__code__.co_varnames[:count])
                t = interleaved(_contenders(kernel, tensors, names), repeats, min_s=0.0005, statistic=min)
                fixed, bound = t["call"] - t["recorded"], t["bound"] - t["recorded"]
                rows.append([str(count), us(t["call"]), us(t["recorded"]), us(fixed), us(bound),
                             f"≤ {us(TARGETS[count])}: {verdict(fixed, TARGETS[count])}"])
    finally:
        torch.set_num_threads(threads)
    return table(["tensor arguments", "replayed call", "recorded torch calls alone", "fixed cost (fast path)",
                  "fixed cost, keyword call (bound)", "target"], rows)


if __name__ == "__main__":
    print(f"## {TITLE}\n\n{run()}")
