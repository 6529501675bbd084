"""Every PYPTO_* knob, declared once: its variable, type, default, doc and audience. Imports only pypto_rt.errors.

Audiences: USER knobs are the settings a user sets (README "Knobs"); LAUNCHER knobs are `pypto-launch` flags'
environment fallbacks (README "CLI reference"); CONTRACT knobs are set by pypto-launch / pypto-run / the host form
for the processes they start (launch/contract.py documents the rank contract); torchrun's own names (RANK, ...)
are declared here too, as contract knobs, so they are read the same way.

Reading: `knob.get()` is the raw string (a scoped override, else the environment, else the default), checked
against `choices`; booleans come back as "1" or "0" (also accepted: true/false, yes/no, on/off, any case; an empty
value means the default); `knob.value()` is the typed value. A malformed value is a one-sentence PyptoError naming
the variable. Overrides (`override({...})`, `scope(NAME=...)`, `pypto_rt.Runtime.options`) live in a
`contextvars.ContextVar`: they hold for the calling thread's context only (the engine hands its run's overrides to
its workers). Knobs are read per call on hot paths, so reading costs a ContextVar get and a bytes-mapping lookup.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass

from pypto_rt.errors import PyptoError

USER, LAUNCHER, CONTRACT = "user", "launcher", "contract"
KINDS = ("bool", "int", "float", "str", "choice")
_BOOLS = {"1": "1", "0": "0", "true": "1", "false": "0", "yes": "1", "no": "0", "on": "1", "off": "0"}

_overrides: contextvars.ContextVar[dict | None] = contextvars.ContextVar("pypto_rt_knob_overrides", default=None)


@dataclass(frozen=True)
class Knob:
    """One environment variable: `kind` (one of KINDS), `default` (a string, as the environment would hold it;
    "" means unset, described by `unset`), `audience` (USER, LAUNCHER or CONTRACT), `minimum` for numbers."""
    env: str
    default: str
    kind: str = "str"
    doc: str = ""
    choices: tuple[str, ...] | None = None
    audience: str = USER
    unset: str = ""
    minimum: float = 0

    def raw(self) -> str:
        """The string in force (override, environment, default), unchecked (for callers with their own errors)."""
        given = self.given()
        return self.default if given is None else given

    def given(self) -> str | None:
        """The string an override or the environment sets, None when neither does (the default is not applied)."""
        overrides = _overrides.get()
        value = overrides.get(self.env) if overrides else None
        return _environ(self.env, None) if value is None else value

    def get(self) -> str:
        overrides = _overrides.get()
        value = overrides.get(self.env) if overrides else None
        if value is None:
            value = _environ(self.env, self.default)
        if self.kind == "bool":
            return _BOOLS.get(value) or self._bool(value)
        if self.choices and value not in self.choices:
            raise PyptoError(f"{self.env}={value!r} is not one of {', '.join(self.choices)}",
                             hint=f"unset {self.env} or set it to one of those")
        return value

    def _bool(self, value: str) -> str:
        if value.strip() == "":
            return _BOOLS[self.default or "0"]
        parsed = _BOOLS.get(value.strip().lower())
        if parsed is None:
            raise PyptoError(f"{self.env}={value!r} is not a boolean: use 1 or 0 (true/false, yes/no, on/off also "
                             "work)", hint=f"unset {self.env} or set it to 1 or 0")
        return parsed

    def on(self) -> bool:
        """A bool knob's value."""
        return self.get() == "1"

    def value(self):
        """The typed value: bool, int / float (None when unset and the default is ""), or str."""
        if self.kind == "bool":
            return self.on()
        if self.kind == "int":
            return get_int(self, int(self.minimum))
        if self.kind == "float":
            return get_float(self)
        return self.get()


# -- user knobs (README "Knobs") -------------------------------------------------------------------------------
EXECUTOR = Knob("PYPTO_EXECUTOR", "compiled", "choice", "which executor runs @pl.jit calls: the reference "
                "interpreter or the compiled runtime", ("reference", "compiled"))
NUM_WORKERS = Knob("PYPTO_NUM_WORKERS", "", "int", "worker threads of the compiled runtime", unset="CPU cores",
                   minimum=1)
WORKER_THREADS = Knob("PYPTO_WORKER_THREADS", "1", "int", "torch intra-op threads of each worker (more than 1 "
                      "only pays for large tiles; see README 'Known limits')", minimum=1)
HOST_INLINE_US = Knob("PYPTO_HOST_INLINE_US", "200", "int", "kernels whose blocks have always taken less than this "
                      "many µs run on the host thread when it waits, and at a run's end the host runs a queued block "
                      "that an idle worker has not picked up yet (0: kernels always run on workers)")
DEVICE_IDS = Knob("PYPTO_DEVICE_IDS", "0", "str", "device ids a @pl.jit.host program spans, one rank process each "
                  "(run_jit sets them from compile_cfg's DistributedConfig)")
TIMEOUT_S = Knob("PYPTO_TIMEOUT_S", "300", "float", "seconds without progress before a run ends with a stall "
                 "report, and the deadline of every communication wait")
RING_SIZE = Knob("PYPTO_RING_SIZE", "4096", "int", "task-ring slots (tasks alive at once) of the compiled runtime",
                 minimum=1)
TRACE = Knob("PYPTO_TRACE", "", "str", "write a Chrome/Perfetto trace of each compiled run to this path",
             unset="off")
STATS = Knob("PYPTO_STATS", "0", "bool", "print per-run task/edge/ring/time counts to stderr")
CHECK = Knob("PYPTO_CHECK", "", "choice", "also run every task on the op library and stop at the first region whose "
             "outputs differ", ("", "reference"), unset="off")
CHECK_TOL = Knob("PYPTO_CHECK_TOL", "1e-5", "float", "rtol = atol of PYPTO_CHECK=reference comparisons")
COALESCE = Knob("PYPTO_COALESCE", "1", "bool", "merge the iterations of tiled loops around a region into one task "
                "per worker (0: one task per iteration)")
COALESCE_CHUNK_MB = Knob("PYPTO_COALESCE_CHUNK_MB", "64", "int", "MiB of tile data (boxes read and written) one "
                         "coalesced task, or one pass of a merged inner tile loop, may span; a bigger loop runs as "
                         "more tasks or passes (0: no bound)")
REPLAY = Knob("PYPTO_REPLAY", "1", "bool", "replay entry calls whose course depends only on shapes, dtypes and "
              "scalar arguments as their recorded torch calls (0: every call runs on the engine)")
KERNEL_REPLAY = Knob("PYPTO_KERNEL_REPLAY", "1", "bool", "tasks run their kernel's recorded torch calls (one block "
                     "recorded per kernel specialisation) instead of the op library's Python")
TIER = Knob("PYPTO_TIER", "background", "choice", "replayed entry calls are compiled with the torch compiler "
            "(inductor): background (the default: on a worker thread at the lowest CPU priority, once a replay "
            "has paid for a compile, swapped in when verified and faster), eager (at the first replay, on the "
            "caller's thread: benchmarks, serving warm-up) or off",
            ("off", "background", "eager"))
DETERMINISTIC = Knob("PYPTO_DETERMINISTIC", "0", "bool", "atomic adds into a target (pl.assemble(..., "
                     "atomic=pl.AtomicType.Add)) are applied in program order, tasks then blocks, whatever order "
                     "they finish in: bit-identical results run to run and to a one-worker run, at some cost")
HEAP_PAD_MB = Knob("PYPTO_HEAP_PAD_MB", "64", "int", "MiB of free memory glibc's malloc keeps at its heap's top (0: "
                   "leave malloc alone), so tiles freed and made again each run do not page-fault in again")
DUMP_DIR = Knob("PYPTO_DUMP_DIR", "", "str", "write the generated host programs and kernels here", unset="off")
CACHE_DIR = Knob("PYPTO_CACHE_DIR", "", "str", "on-disk kernel cache ('off' disables it)",
                 unset="~/.cache/pypto-rt")
GOLDEN_NUM_THREADS = Knob("PYPTO_GOLDEN_NUM_THREADS", "", "int", "torch threads the golden harness sets on import",
                          unset="min(16, cores)", minimum=1)
GOLDEN_REPEAT = Knob("PYPTO_GOLDEN_REPEAT", "1", "int", "kernel calls per harness run, each on fresh inputs and checked "
                     "against the golden (later calls replay; with PYPTO_TIER=eager, compiled)", minimum=1)
BENCH = Knob("PYPTO_BENCH", "0", "bool", "a kernel-library file's benchmark request: on the CPU the harness says "
             "it has no effect and skips it")
START_TIMEOUT_S = Knob("PYPTO_START_TIMEOUT_S", "120", "float", "seconds a new communicator waits for every rank to "
                       "start (its rendezvous); waits inside the job use PYPTO_TIMEOUT_S, whose clock starts only "
                       "after this rendezvous")
COMM_CHECK = Knob("PYPTO_COMM_CHECK", "0", "bool", "before each collective, ranks compare (sequence number, op, "
                  "shape, dtype) through the store: a mismatch is an error naming both ranks instead of a hang")
SHM_BLOCK = Knob("PYPTO_SHM_BLOCK", "1", "bool", "with no more ranks than cores, a shm wait past its spin and "
                 "yields blocks on a futex of its cell (Linux) until the peer's signal wakes it; 0: it sleeps "
                 "doubling instead")
SHM_POLL_US = Knob("PYPTO_SHM_POLL_US", "", "int", "with futex waits on (PYPTO_SHM_BLOCK), a shm wait keeps "
                   "polling with yields for this many microseconds before it blocks (0: never polls): a blocked "
                   "waiter wakes 0.4-1 ms after the signal on a virtual machine whose idle core halts; polls pay only "
                   "where ranks have cores to themselves (under other jobs' load they slow the peer)", minimum=0,
                   unset="adaptive")   # unset: collective/poll_policy.py decides per wait
MOE_PEER_STAGING = Knob("PYPTO_MOE_PEER_STAGING", "1", "bool", "an MoEBuffer on the shm communicator stages its "
                        "sends and sums in the peers' windows, mapped here, so the puts of those rows copy nothing "
                        "(where a block is whole pages; 0: plain staging tensors the puts copy from)")
FRONTEND_DEBUG = Knob("PYPTO_FRONTEND_DEBUG", "0", "bool", "keep pypto-rt's own frames in tracebacks (for pypto-rt "
                      "developers)")

# -- pypto-launch flags' environment fallbacks (README "CLI reference"; the flag wins) ---------------------------
NPROC = Knob("PYPTO_NPROC", "", "int", "ranks on this host (default 1)", audience=LAUNCHER, minimum=1)
NNODES = Knob("PYPTO_NNODES", "", "int", "hosts in the job, one launcher each (default 1)", audience=LAUNCHER,
              minimum=1)
NODE_RANK = Knob("PYPTO_NODE_RANK", "", "int", "this host's index, 0 .. nnodes-1 (default 0); node 0 hosts the "
                 "store", audience=LAUNCHER)
MASTER_ADDR_FLAG = Knob("PYPTO_MASTER_ADDR", "", "str", "node 0's address, where the store listens (only there) "
                        "with --nnodes > 1; one host: the store listens on 127.0.0.1", audience=LAUNCHER)
MASTER_PORT_FLAG = Knob("PYPTO_MASTER_PORT", "", "int", "its port (default: a free port the store binds; required "
                        "on node-rank > 0)", audience=LAUNCHER)
LOG_DIR = Knob("PYPTO_LOG_DIR", "", "str", "write rankN.stdout.log, rankN.stderr.log and rankN.error.json here",
               audience=LAUNCHER)
TEE = Knob("PYPTO_TEE", "0", "bool", "with --log-dir, also echo rank output to the terminal as [rank N] lines",
           audience=LAUNCHER)
COMM = Knob("PYPTO_COMM", "", "choice", "communicator for the ranks: shm|gloo|nccl|hccl (default shm on one host, "
            "else gloo); in a launched rank, the communicator it builds", ("", "shm", "gloo", "nccl", "hccl"),
            audience=LAUNCHER)
LAUNCH_BACKEND = Knob("PYPTO_LAUNCH_BACKEND", "", "str", "how ranks start: local|ray (default local; ray: one Ray "
                      "actor per rank)", audience=LAUNCHER)
RAY_ADDRESS = Knob("PYPTO_RAY_ADDRESS", "", "str", "with --backend ray: the cluster to attach to, auto|HOST:PORT "
                   "(default: start a Ray instance for the job)", audience=LAUNCHER)
PLACEMENT = Knob("PYPTO_PLACEMENT", "", "str", "with --backend ray: pack|spread the ranks over the nodes (default pack)",
                 audience=LAUNCHER)
RANK_RESOURCES = Knob("PYPTO_RANK_RESOURCES", "", "str", "with --backend ray: each rank's bundle, NAME=AMOUNT,... "
                      "(default CPU=1; e.g. CPU=1,GPU=1 or CPU=1,NPU=1)", audience=LAUNCHER)
JOB_ID = Knob("PYPTO_JOB_ID", "", "str", "names the job's shared memory (pypto-<id>*); default: random",
              audience=LAUNCHER)
JOB_SECRET = Knob("PYPTO_JOB_SECRET", "", "str", "the job's store secret (environment only, never a flag: argv is "
                  "public in /proc); every key lives under it; default: random per job, required with --nnodes > 1",
                  audience=LAUNCHER)

# -- set for the processes pypto-launch / pypto-run start (launch/contract.py) ----------------------------------
LAUNCHED = Knob("PYPTO_LAUNCHED", "0", "bool", "this process is a rank pypto-launch started", audience=CONTRACT)
SHM_PREFIX = Knob("PYPTO_SHM_PREFIX", "", "str", "name prefix of this job's /dev/shm segments (no '+': segments are "
                  "<prefix>+...), set by the launcher (which then removes /dev/shm/<prefix>+* at job end); unset: the "
                  "communicator picks one and unlinks its own segments", audience=CONTRACT)
RANK_NODES = Knob("PYPTO_RANK_NODES", "", "str", "with --backend ray over several nodes: each rank's node index, "
                  "comma-separated by rank (shared-memory windows need their ranks on one node)", audience=CONTRACT)
THREADS_SET = Knob("PYPTO_THREADS_SET", "", "str", "the thread counts the launcher chose for this rank (its share "
                   "of the host's cores; comma-separated names): a --backend ray launch from this rank does not pass "
                   "them on as the user's", audience=CONTRACT)
ERROR_FILE = Knob("PYPTO_ERROR_FILE", "", "str", "where a rank writes its error record (JSON) when it fails",
                  audience=CONTRACT)
STACK_FILE = Knob("PYPTO_STACK_FILE", "", "str", "where a rank writes every thread's stack on SIGUSR1",
                  audience=CONTRACT)
RUN_CPU_FALLBACK = Knob("PYPTO_RUN_CPU_FALLBACK", "0", "bool", "set by pypto-run: an NPU platform request runs on "
                        "the CPU with a notice", audience=CONTRACT)
INDUCTOR_CACHE_DIR = Knob("TORCHINDUCTOR_CACHE_DIR", "", "str", "torch inductor's cache folder (torch's own "
                          "variable): unless set, the compiled tier sets it to <PYPTO_CACHE_DIR>/inductor; its compile "
                          "process follows the caller's", audience=CONTRACT)
RANK = Knob("RANK", "", "int", "this process's rank", audience=CONTRACT)
LOCAL_RANK = Knob("LOCAL_RANK", "", "int", "this process's rank on its host (picks its GPU / NPU)", audience=CONTRACT)
WORLD_SIZE = Knob("WORLD_SIZE", "", "int", "ranks in the job", audience=CONTRACT, minimum=1)
MASTER_ADDR = Knob("MASTER_ADDR", "", "str", "host of the job's TCPStore", audience=CONTRACT)
MASTER_PORT = Knob("MASTER_PORT", "", "str", "port of the job's TCPStore", audience=CONTRACT)

ALL: tuple[Knob, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Knob))
BY_ENV: dict[str, Knob] = {k.env: k for k in ALL}
__all__ = [name for name, v in list(globals().items()) if isinstance(v, Knob)] + [
    "Knob", "Snapshot", "ALL", "BY_ENV", "USER", "LAUNCHER", "CONTRACT", "get_int", "get_float", "current_overrides",
    "install", "override", "drop_override", "scope"]
assert len(BY_ENV) == len(ALL), "a variable is declared twice"
assert all(k.kind in KINDS for k in ALL)

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


class Snapshot:
    """Several knobs read together on a hot path: `values()` is their `get()`s, as a tuple, derived again only
    when an override or one of their environment variables changed since the last call (the raw environment
    values are compared, ~1 µs in all). Overrides are compared by identity: `override`, `drop_override` and
    `install` always set a new dict, never change one in place."""

    def __init__(self, *knobs: Knob):
        self.knobs = knobs
        self._names = tuple(k.env for k in knobs)
        self._keys = None if _ENV_DATA is None or _encode_key is None else tuple(map(_encode_key, self._names))
        self._last = (self, None, None)   # (overrides, raw environment values, values): `self` matches nothing

    def values(self) -> tuple[str, ...]:
        overrides = _overrides.get()
        keys = self._keys
        raw = tuple(map(_ENV_DATA.get, keys)) if keys is not None else tuple(map(os.environ.get, self._names))
        last_overrides, last_raw, values = self._last
        if overrides is not last_overrides or raw != last_raw:
            values = tuple(knob.get() for knob in self.knobs)
            self._last = (overrides, raw, values)   # (one assignment: another thread sees the old or the new)
        return values


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
    """A positive float knob (seconds, tolerances); a malformed value is a one-sentence error."""
    raw = knob.get()
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise PyptoError(f"{knob.env}={raw!r} must be a positive number", hint=f"unset {knob.env} or fix it")
    return value


def current_overrides() -> dict | None:
    """The overrides in force in this context (variable -> string), to hand to another thread (`install`)."""
    return _overrides.get()


def install(overrides: dict | None) -> None:
    """Make `overrides` (from `current_overrides`) this thread's own: a worker serving another thread's run."""
    if _overrides.get() is not overrides:
        _overrides.set(overrides)


@contextlib.contextmanager
def override(values: dict[str, str]):
    """Override knobs by variable name ({"PYPTO_EXECUTOR": "reference"}) for this context, inside a with block."""
    unknown = [name for name in values if name not in BY_ENV]
    if unknown:
        raise PyptoError(f"unknown knob {unknown[0]!r}", hint=f"known: {', '.join(sorted(BY_ENV))}")
    token = _overrides.set({**(_overrides.get() or {}), **values})
    try:
        yield
    finally:
        _overrides.reset(token)


def drop_override(knob: Knob) -> None:
    """From now on in this context, `knob` reads the environment again (a forked rank resetting its threads)."""
    current = _overrides.get()
    if current and knob.env in current:
        _overrides.set({k: v for k, v in current.items() if k != knob.env})


def scope(**values: str):
    """Override knobs by attribute name (`scope(EXECUTOR="reference")`) inside a with block (tests)."""
    knobs = globals()
    for name in values:
        if not isinstance(knobs.get(name), Knob):
            raise PyptoError(f"unknown knob attribute {name!r}", hint="use a name declared in pypto_rt/knobs.py")
    return override({knobs[name].env: value for name, value in values.items()})
