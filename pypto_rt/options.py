"""`Options`: the user knobs (pypto_rt.knobs, audience USER) as typed fields. Imports only knobs and errors.

A field left None takes what is in force where the options apply (an enclosing override, else the environment,
else the knob's default), so the environment variables are the defaults. `Options(...).overrides()` is the mapping
(variable -> string) that `knobs.override` installs for a scope; `Options.current()` reads what is in force.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

from pypto_rt import knobs
from pypto_rt.errors import PyptoError


@dataclass(frozen=True)
class Options:
    """pypto-rt's settings for the calls made where they apply (see `pypto_rt.Runtime.options`). Each field is a
    PYPTO_* knob (field `num_workers` is PYPTO_NUM_WORKERS; README "Knobs" says what each does); None: the
    environment's value, else the default."""
    executor: str | None = None
    num_workers: int | None = None
    worker_threads: int | None = None
    host_inline_us: int | None = None
    device_ids: str | None = None
    timeout_s: float | None = None
    ring_size: int | None = None
    trace: str | None = None
    stats: bool | None = None
    check: str | None = None
    check_tol: float | None = None
    coalesce: bool | None = None
    coalesce_chunk_mb: int | None = None
    replay: bool | None = None
    kernel_replay: bool | None = None
    tier: str | None = None
    deterministic: bool | None = None
    heap_pad_mb: int | None = None
    dump_dir: str | None = None
    cache_dir: str | None = None
    golden_num_threads: int | None = None
    golden_repeat: int | None = None
    bench: bool | None = None
    start_timeout_s: float | None = None
    comm_check: bool | None = None
    shm_block: bool | None = None
    shm_poll_us: int | None = None
    moe_peer_staging: bool | None = None
    frontend_debug: bool | None = None

    def __post_init__(self):
        overrides = self.overrides()
        with knobs.override(overrides):   # a value the knob would refuse is refused here, naming the option
            for name in overrides:
                try:
                    knobs.BY_ENV[name].value()
                except PyptoError as e:
                    raise PyptoError(f"Options({_field(name)}=...): {e.message}") from None

    def overrides(self) -> dict[str, str]:
        """The variables these options set (fields not None), as the environment would hold them."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[knob_of(f.name).env] = _text(value)
        return out

    def merged(self, other: Options | dict | None) -> Options:
        """These options with `other`'s fields that are not None on top."""
        other = as_options(other)
        return Options(**{f.name: _first(getattr(other, f.name), getattr(self, f.name)) for f in fields(self)})

    @classmethod
    def current(cls) -> Options:
        """Every option's value in force in this context (override, environment or default), typed."""
        return cls(**{f.name: knob_of(f.name).value() for f in fields(cls)})


def knob_of(field_name: str) -> knobs.Knob:
    return knobs.BY_ENV["PYPTO_" + field_name.upper()]


def as_options(value: Options | dict | None) -> Options:
    """`value` as Options: an Options, a dict of field values, or None (no fields set)."""
    if value is None:
        return Options()
    if isinstance(value, Options):
        return value
    if isinstance(value, dict):
        names = {f.name for f in fields(Options)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise PyptoError(f"unknown option {unknown[0]!r}", hint=f"options: {', '.join(sorted(names))}")
        return Options(**value)
    raise PyptoError(f"options must be an Options or a dict of option values, got {type(value).__name__}")


def scoped(value: Options | dict | None):
    """A with block in which `value`'s fields override the knobs (this context only)."""
    overrides = as_options(value).overrides()
    return knobs.override(overrides) if overrides else contextlib.nullcontext()


def _text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _first(a, b):
    return b if a is None else a


def _field(env: str) -> str:
    return env.removeprefix("PYPTO_").lower()
