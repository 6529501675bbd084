"""The trial policy: when replay is on, when a run is recorded, how replays are tried against the engine, and the
limits of a recording, as one frozen `ReplayPolicy` with declared fields.

`current_policy()` is the policy in force: the declared defaults, `enabled`, `kernel_replay` and `tier` from the
PYPTO_* knobs (read through `config` on each call, as before), and the changes of any `policy_scope(**changes)`
around the caller (a `contextvars.ContextVar`, so a scope on one thread or task is not seen by others). Kernel
replay decides on the engine's worker threads, which do not inherit the caller's context: the task runner takes the
policy in force when a run starts and hands it to the kernel replays that run uses.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass

from pypto_rt import config


@dataclass(frozen=True)
class ReplayPolicy:
    # -- on or off -----------------------------------------------------------------------------------------
    enabled: bool = True               # entry calls replay (PYPTO_REPLAY=1, and no PYPTO_TRACE / PYPTO_CHECK run)
    kernel_replay: bool = True         # tasks run their kernel's recorded blocks (PYPTO_KERNEL_REPLAY=1)
    # -- entry calls (replay.entry), per specialisation ------------------------------------------------------
    normal_runs: int = 2               # engine runs before recording (the first compiles)
    trial_replays: int = 3             # replays timed (after one to warm up) before the faster way is kept
    max_specialisations: int = 16      # per entry; later ones run on the engine
    parallel: float = 1.5              # an engine run whose kernels add up to this much more than its wall time
                                       # ran in parallel ...
    long_task_ns: int = 2_000_000      # ... and pays off only with tasks this long on average (shorter: thread
                                       # hand-offs dominate): such a specialisation is not recorded
    slower: float = 1.15               # a replay this much slower than the engine's fastest run is dropped
    misses: int = 8                    # guard misses after which a replay that misses more often than it runs
                                       # is dropped (or recorded again, see max_recordings)
    max_recordings: int = 3            # per specialisation: a recording refused inside a block, or a replay
                                       # dropped for misses of guards made inside blocks, is recorded again with
                                       # those kernels' blocks called as they are, up to this many recordings
    # -- the compiled tier (replay.tier), per specialisation ------------------------------------------------
    tier: str = "background"           # PYPTO_TIER: off (never compiled), background, or eager
    tier_after_replays: int = 500      # background: a kept replay is compiled once it has paid for a compile:
    tier_after_replayed_ms: float = 2000.0   # this many replays *and* this much replayed time (replays times
                                       # its fastest timed call). A warm compile costs 0.1-2 s of CPU (cold:
                                       # 5-75 s) and pays back after ~400-600 calls (benchmark 16), so a short
                                       # run never compiles; eager: at the first replay
    tier_trial_calls: int = 4          # compiled and replayed calls timed each (after one to warm up) before the
                                       # faster is kept
    tier_timeout_s: float = 300.0      # a compile still running after this keeps the replay
    tier_max_copy_bytes: int = 256 << 20   # the check copies the arguments' memory: larger ones stay replayed
    tier_min_segment_calls: int = 8    # a replay that communicates is compiled per run of torch calls between its
                                       # communication lines (replay.tier_segments); shorter runs stay replayed
    tier_max_segment_calls: int = 96   # a longer replay (not one that communicates) is compiled in segments of
                                       # at most this many torch lines, called in a row (a cold build ~linear in
                                       # the length, not ~quadratic: inductor's fusion search); 0: whole
    # -- kernel blocks (replay.kernel), per specialisation ---------------------------------------------------
    kernel_normal_runs: int = 32       # blocks (over all calls) run by the kernel before one is recorded: a
                                       # recording costs 10-70 blocks' time, so a one-off run does not pay it
    kernel_warm_replays: int = 2       # first replays, not timed (cold code, the recording's end)
    kernel_trial_replays: int = 8      # replays timed after those before the replay is kept or dropped
    kernel_max_specialisations: int = 16   # per kernel; blocks of later ones run the kernel
    kernel_slower: float = 1.5         # a replay this much slower than the kernel's fastest block is dropped
    kernel_misses: int = 8             # as `misses`, for blocks
    # -- one recording (replay.capture, replay.passes) -------------------------------------------------------
    max_held_bytes: int = 2 << 30      # a recording keeps every tensor the run makes alive: refused beyond this
    read_whole_elements: int = 4096    # an entry tensor of at most this many elements that a replay reads
                                       # numbers from is read whole (`.tolist()`), else element by element
    hoist_lines: int = 400             # replays longer than this keep repeated arithmetic in place


_changes: contextvars.ContextVar[tuple] = contextvars.ContextVar("pypto_rt_replay_policy", default=())
_last: tuple = (None, None)   # (key, policy): the policy built last, reused while knobs and scope are the same
policy_knobs = (config.REPLAY, config.TRACE, config.CHECK, config.KERNEL_REPLAY, config.TIER)   # what it reads
_knobs = config.Snapshot(*policy_knobs)


def current_policy() -> ReplayPolicy:
    """The policy in force here: declared defaults, the knobs as set now, and the enclosing `policy_scope`s."""
    global _last
    key = (_knobs.values(), _changes.get())
    last_key, policy = _last
    if key != last_key:
        (replay, trace, check, kernel, tier), changes = key
        policy = dataclasses.replace(ReplayPolicy(enabled=replay == "1" and not trace and check == "",
                                                  kernel_replay=kernel == "1", tier=tier), **dict(changes))
        _last = (key, policy)   # (one assignment: another thread sees the old pair or the new one)
    return policy


def scope_changes() -> tuple:
    """The changes of the `policy_scope`s around the caller: a new tuple whenever they change (a cache of what
    `current_policy()` gives may compare it by identity)."""
    return _changes.get()


@contextlib.contextmanager
def policy_scope(**changes):
    """Change fields of the policy in force inside a `with` block (a field name that does not exist raises)."""
    unknown = set(changes) - {f.name for f in dataclasses.fields(ReplayPolicy)}
    if unknown:
        raise TypeError(f"ReplayPolicy has no field {', '.join(sorted(unknown))}")
    token = _changes.set(tuple({**dict(_changes.get()), **changes}.items()))
    try:
        yield current_policy()
    finally:
        _changes.reset(token)
