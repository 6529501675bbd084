"""`make bench`: executor time against the torch golden's time on the same inputs, per conformance kernel.

Prints a markdown table of ratios measured in one run (median of repeats). Ratios, not seconds,
are what carry between machines.
"""
from __future__ import annotations

import glob
import importlib.util
import inspect
import math
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(path):
    import pypto_rt.golden as golden
    sys.modules["golden"] = golden
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry(module):
    from pypto_rt.language.decorators import KernelFunction, program_entry
    for value in vars(module).values():
        if getattr(value, "__pypto_program__", False):
            return program_entry(value)
    kernels = [v for v in vars(module).values() if isinstance(v, KernelFunction) and v.kind == "jit"]
    return kernels[-1]


def _specs(module):
    params = inspect.signature(module.build_specs).parameters
    required = [p for p in params.values() if p.default is inspect.Parameter.empty]
    return module.build_specs(*([128] * len(required)))


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_kernel(path, repeats=5):
    module = _load(path)
    entry = _entry(module)
    golden = next(v for k, v in vars(module).items() if k.startswith("golden_") and callable(v))
    specs = _specs(module)
    tensors = {s.name: s.create_tensor() if hasattr(s, "create_tensor") else s.to_python() for s in specs}
    args = [tensors[s.name] for s in specs]
    entry(*args)  # warm-up (first-call preparation is not what this row measures)
    t_kernel = _median_time(lambda: entry(*args), repeats)
    t_golden = _median_time(lambda: golden(dict(tensors)), repeats)
    return os.path.basename(path), t_kernel, t_golden


def main() -> int:
    torch.set_num_threads(1)
    paths = sorted(glob.glob(os.path.join(REPO, "tests", "conformance", "c0*.py")))
    rows = [bench_kernel(p) for p in paths]
    executor = os.environ.get("PYPTO_EXECUTOR", "reference")
    print(f"executor={executor}, torch threads=1, median of 5 runs\n")
    print("| kernel | executor / golden time |")
    print("|---|---|")
    for name, tk, tg in rows:
        print(f"| {name} | {tk / tg:.1f}x |")
    gmean = math.exp(sum(math.log(tk / tg) for _, tk, tg in rows) / len(rows))
    print(f"| geometric mean | {gmean:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
