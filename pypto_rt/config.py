"""The knobs under the name most call sites and tests use: `config.EXECUTOR.get()`, `config.scope(...)`.

Every knob is declared in `pypto_rt.knobs` (name, type, default, doc, audience); this module re-exports that
table and its readers and declares nothing itself. `config.scope(EXECUTOR="reference")` overrides knobs for a
block in the calling context (see knobs.py: a `contextvars` override, handed by the engine to its workers).
"""
from __future__ import annotations

from pypto_rt.knobs import *  # noqa: F401,F403 - the one declaration table and its readers
from pypto_rt.knobs import __all__  # noqa: F401
