"""Typed PYPTO_* knobs: the only module-level mutable state (read from the environment on use).

`config.scope(EXECUTOR="reference")` overrides knobs for a block (tests).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from pypto_rt.errors import PyptoError


@dataclass(frozen=True)
class Knob:
    env: str
    default: str
    choices: tuple[str, ...] | None = None
    doc: str = ""

    def get(self) -> str:
        value = _overrides.get(self.env, os.environ.get(self.env, self.default))
        if self.choices and value not in self.choices:
            raise PyptoError(f"{self.env}={value!r} is not one of {', '.join(self.choices)}",
                             hint=f"unset {self.env} or set it to one of those")
        return value


EXECUTOR = Knob("PYPTO_EXECUTOR", "reference", ("reference", "compiled"),
                "which executor runs @pl.jit calls: the reference interpreter or the compiled runtime")
GOLDEN_NUM_THREADS = Knob("PYPTO_GOLDEN_NUM_THREADS", "", None, "torch threads set by the golden harness")
RUN_CPU_FALLBACK = Knob("PYPTO_RUN_CPU_FALLBACK", "0", ("0", "1"),
                        "set by pypto-run: an NPU platform request runs on the CPU with a notice")

_overrides: dict[str, str] = {}


@contextlib.contextmanager
def scope(**values: str):
    """Override knobs (by attribute name, e.g. EXECUTOR="reference") inside a with block."""
    saved = dict(_overrides)
    for name, value in values.items():
        _overrides[globals()[name].env] = value
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)
