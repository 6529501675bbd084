"""pypto-rt: runs PyPTO (pl DSL) kernels on the CPU.

Kernels are written with `import pypto.language as pl` and run by calling them. A program embedding pypto-rt
(a serving loop, a notebook) can also hold the runtime and read what each call did:

- `Runtime`: options, engine lock and worker pool of one embedding; `rt.run(fn, *args)` returns a `RunResult`
  (`.outputs`, `.stats`); `with rt:` / `with rt.options(executor="reference"):` scope it to a block.
- `Options`: the PYPTO_* knobs as typed fields (the environment gives the ones left None).
- `RunStats`, `ReplayDecision`: a call's figures (tasks, edges, time split) and how replay treated it.
- `default_runtime()`: the runtime plain `@pl.jit` calls use.
- `use_deterministic_algorithms`, `are_deterministic_algorithms_enabled`: PYPTO_DETERMINISTIC, torch-style.

Importing `pypto_rt` stays cheap (no torch): these names load on first use.
"""
from __future__ import annotations

import importlib
import os

__all__ = ["Runtime", "Options", "RunResult", "RunStats", "ReplayDecision", "default_runtime",
           "use_deterministic_algorithms", "are_deterministic_algorithms_enabled"]

# public name -> the module defining it (imported on first access: the runtime pulls in torch)
_LAZY = {"Runtime": "pypto_rt.runtime", "RunResult": "pypto_rt.runtime", "default_runtime": "pypto_rt.runtime",
         "Options": "pypto_rt.options", "RunStats": "pypto_rt.run_stats", "ReplayDecision": "pypto_rt.run_stats"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pypto_rt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def use_deterministic_algorithms(mode: bool = True) -> None:
    """Like torch.use_deterministic_algorithms: with `mode`, atomic adds into a target are applied in program order
    (PYPTO_DETERMINISTIC=1, see README 'Knobs'). Sets the variable in this process's environment, so rank
    processes it starts later inherit it; an override (`Runtime.options(deterministic=...)`) still wins."""
    os.environ["PYPTO_DETERMINISTIC"] = "1" if mode else "0"


def are_deterministic_algorithms_enabled() -> bool:
    """Whether atomic adds are applied in program order where this is called (PYPTO_DETERMINISTIC in force)."""
    from pypto_rt import knobs

    return knobs.DETERMINISTIC.on()
