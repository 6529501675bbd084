"""Loading the conformance kernels (tests/conformance/c0*.py): entry, golden and one set of inputs each."""
from __future__ import annotations

import glob
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED_ARG = 128  # build_specs parameters without a default (c03's token count: the "prefill" size)


def paths() -> list[str]:
    return sorted(glob.glob(os.path.join(REPO, "tests", "conformance", "c0*.py")))


def short(path: str) -> str:
    return os.path.basename(path)[:-3]


def load_module(path):
    """Import a kernel-library file the way pypto-run does (`golden` = pypto_rt.golden)."""
    import pypto_rt.golden as golden
    sys.modules["golden"] = golden
    spec = importlib.util.spec_from_file_location(short(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry_of(module):
    """The callable entry: a @pl.program's entry function, else the file's last @pl.jit kernel."""
    from pypto_rt.language.decorators import KernelFunction, program_entry
    for value in vars(module).values():
        if getattr(value, "__pypto_program__", False):
            return program_entry(value)
    kernels = [v for v in vars(module).values() if isinstance(v, KernelFunction) and v.kind == "jit"]
    return kernels[-1]


@dataclass
class Case:
    name: str
    entry: object
    golden: object
    tensors: dict
    args: list

    def run_entry(self):
        self.entry(*self.args)

    def run_golden(self):
        self.golden(dict(self.tensors))


def case(path) -> Case:
    module = load_module(path)
    params = inspect.signature(module.build_specs).parameters
    required = [p for p in params.values() if p.default is inspect.Parameter.empty]
    specs = module.build_specs(*([REQUIRED_ARG] * len(required)))
    tensors = {s.name: s.create_tensor() if hasattr(s, "create_tensor") else s.to_python() for s in specs}
    golden = next(v for k, v in vars(module).items() if k.startswith("golden_") and callable(v))
    return Case(short(path), entry_of(module), golden, tensors, [tensors[s.name] for s in specs])
