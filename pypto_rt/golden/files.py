"""Kernel-library files as modules: import one the way `pypto-run` runs it, and find its entry kernel."""
from __future__ import annotations

import importlib.util
import os
import sys


def load_kernel_file(path: str, name: str | None = None):
    """Import a kernel-library style file (its `from golden import ...` gets pypto_rt.golden)."""
    import pypto_rt.golden as golden
    sys.modules.setdefault("golden", golden)
    spec = importlib.util.spec_from_file_location(name or os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_entry(module):
    """The callable entry of a loaded file: a @pl.program's entry function, else its last @pl.jit kernel."""
    from pypto_rt.language.decorators import KernelFunction, program_entry
    for value in vars(module).values():
        if getattr(value, "__pypto_program__", False):
            return program_entry(value)
    kernels = [v for v in vars(module).values() if isinstance(v, KernelFunction) and v.kind == "jit"]
    return kernels[-1]
