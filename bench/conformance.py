"""Loading the conformance kernels (tests/conformance/c0*.py): entry, golden and one set of inputs each."""
from __future__ import annotations

import glob
import inspect
import os
from dataclasses import dataclass

from pypto_rt.golden.files import kernel_entry, load_kernel_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED_ARG = 128  # build_specs parameters without a default (c03's token count: the "prefill" size)


MULTI_RANK = ("c08_allreduce_host.py", "c09_allgather_launched.py")   # multi-rank programs: not timed here


def paths() -> list[str]:
    """The single-rank conformance kernels."""
    return sorted(p for p in glob.glob(os.path.join(REPO, "tests", "conformance", "c0*.py"))
                  if os.path.basename(p) not in MULTI_RANK)


def short(path: str) -> str:
    return os.path.basename(path)[:-3]


def load_module(path):
    """Import a kernel-library file the way pypto-run does (`golden` = pypto_rt.golden)."""
    return load_kernel_file(path, short(path))


def entry_of(module):
    return kernel_entry(module)


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
