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
        value = _overrides.get(self.env) if _overrides else None
        if value is None:
            value = _environ(self.env, self.default)
        if self.choices and value not in self.choices:
            raise PyptoError(f"{self.env}={value!r} is not one of {', '.join(self.choices)}",
                             hint=f"unset {self.env} or set it to one of those")
        return value


EXECUTOR = Knob("PYPTO_EXECUTOR", "compiled", ("reference", "compiled"),
                "which executor runs @pl.jit calls: the reference interpreter or the compiled runtime")
GOLDEN_NUM_THREADS = Knob("PYPTO_GOLDEN_NUM_THREADS", "", None, "torch threads set by the golden harness")
RUN_CPU_FALLBACK = Knob("PYPTO_RUN_CPU_FALLBACK", "0", ("0", "1"),
                        "set by pypto-run: an NPU platform request runs on the CPU with a notice")

NUM_WORKERS = Knob("PYPTO_NUM_WORKERS", "", None, "worker threads of the compiled runtime (default: CPU cores)")
WORKER_THREADS = Knob("PYPTO_WORKER_THREADS", "1", None, "torch intra-op threads of each worker (more than 1 "
                      "only pays for large tiles; see README 'Known limits')")
HOST_INLINE_US = Knob("PYPTO_HOST_INLINE_US", "200", None, "kernels whose blocks have always taken less than this "
                      "many µs run on the host thread when it waits, and at a run's end the host runs a queued block "
                      "that an idle worker has not picked up yet (0: kernels always run on workers)")
DEVICE_IDS = Knob("PYPTO_DEVICE_IDS", "0", None, "device ids a @pl.jit.host program spans, one rank process each "
                  "(run_jit sets them from compile_cfg's DistributedConfig)")
TIMEOUT_S = Knob("PYPTO_TIMEOUT_S", "300", None, "seconds without progress before a run ends with a stall report")
RING_SIZE = Knob("PYPTO_RING_SIZE", "4096", None, "task-ring slots (tasks alive at once) of the compiled runtime")
TRACE = Knob("PYPTO_TRACE", "", None, "write a Chrome/Perfetto trace of each compiled run to this path")
STATS = Knob("PYPTO_STATS", "0", ("0", "1"), "print per-run task/edge/ring/time counts to stderr")
CHECK = Knob("PYPTO_CHECK", "", ("", "reference"), "also run every task on the op library and stop at the first "
             "region whose outputs differ")
COALESCE = Knob("PYPTO_COALESCE", "1", ("0", "1"), "merge the iterations of tiled loops around a region into "
                "one task per worker (0: one task per iteration)")
COALESCE_CHUNK_MB = Knob("PYPTO_COALESCE_CHUNK_MB", "64", None, "MiB of tile data (boxes read and written) one "
                         "coalesced task, or one pass of a merged inner tile loop, may span; a bigger loop runs as "
                         "more tasks or passes (0: no bound)")
REPLAY = Knob("PYPTO_REPLAY", "1", ("0", "1"), "replay entry calls whose course depends only on shapes, dtypes "
               "and scalar arguments as their recorded torch calls (0: every call runs on the engine)")
KERNEL_REPLAY = Knob("PYPTO_KERNEL_REPLAY", "1", ("0", "1"), "tasks run their kernel's recorded torch calls "
                     "(one block recorded per kernel specialisation) instead of the op library's Python")
DETERMINISTIC = Knob("PYPTO_DETERMINISTIC", "0", ("0", "1"), "atomic adds into a target (pl.assemble(..., "
                     "atomic=pl.AtomicType.Add)) are applied in program order, tasks then blocks, whatever order "
                     "they finish in: bit-identical results run to run and to a one-worker run, at some cost")
HEAP_PAD_MB = Knob("PYPTO_HEAP_PAD_MB", "64", None, "MiB of free memory glibc's malloc keeps at its heap's top (0: "
                   "leave malloc alone), so tiles freed and made again each run do not page-fault in again")
DUMP_DIR = Knob("PYPTO_DUMP_DIR", "", None, "write the generated host programs and kernels here")
CACHE_DIR = Knob("PYPTO_CACHE_DIR", "", None, "on-disk kernel cache (default ~/.cache/pypto-rt; 'off' disables)")

_overrides: dict[str, str] = {}

# os.environ.get encodes the name and decodes the value on every call (~1 µs); knobs are read several times per
# run, so read CPython's underlying bytes mapping with names encoded once (same values, ~0.05 µs).
_ENV_DATA = getattr(os.environ, "_data", None)
_encode_key = getattr(os.environ, "encodekey", None)
_decode_value = getattr(os.environ, "decodevalue", None)
_encoded: dict[str, object] = {}


def _environ(name: str, default: str) -> str:
    if _ENV_DATA is None or _encode_key is None or _decode_value is None:
        return os.environ.get(name, default)
    key = _encoded.get(name)
    if key is None:
        key = _encoded[name] = _encode_key(name)
    raw = _ENV_DATA.get(key)
    return default if raw is None else _decode_value(raw)


def get_int(knob: Knob, minimum: int = 0) -> int | None:
    """An integer knob, or None when unset; a malformed value is a one-sentence error."""
    raw = knob.get()
    if raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise PyptoError(f"{knob.env}={raw!r} must be an integer >= {minimum}", hint=f"unset {knob.env} or fix it")
    return value


def get_float(knob: Knob) -> float:
    raw = knob.get()
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise PyptoError(f"{knob.env}={raw!r} must be a positive number of seconds", hint=f"unset {knob.env}")
    return value


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
