"""The single-rank conformance kernels (c01-c07) as the compiled-runtime tests load them."""
from __future__ import annotations

import glob
import inspect
import os

import torch

from pypto_rt.golden.files import kernel_entry, load_kernel_file

CONFORMANCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conformance")
KERNELS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CONFORMANCE, "c0[1-7]*.py")))


def load(name: str, prefix: str):
    """(entry, specs, output names) of conformance kernel file `name`, loaded as its own module; a kernel whose
    specs take sizes gets 64 for each."""
    module = load_kernel_file(os.path.join(CONFORMANCE, name), f"{prefix}_{name[:-3]}")
    required = [p for p in inspect.signature(module.build_specs).parameters.values()
                if p.default is inspect.Parameter.empty]
    specs = module.build_specs(*([64] * len(required)))
    return kernel_entry(module), specs, [s.name for s in specs if getattr(s, "is_output", False)]


def fresh_inputs(specs, seed: int) -> dict:
    torch.manual_seed(seed)
    return {s.name: s.create_tensor() if hasattr(s, "create_tensor") else s.to_python() for s in specs}
