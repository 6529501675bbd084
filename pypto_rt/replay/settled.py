"""The settings a replayed entry call runs under, and the settled path: once nothing is left to decide for a
specialisation (replay.entry: its trial over, its tier settled), `KernelFunction.__call__` calls the chosen function
through a closure installed on the kernel, without the driver; any change of a knob or of a policy scope, a
specialisation no longer steady or a guard miss uninstalls it and hands the call back to the driver.
"""
from __future__ import annotations

import math
import warnings

from torch import get_num_threads, set_num_threads

from pypto_rt import config
from pypto_rt.kernel_state import NOT_SETTLED
from pypto_rt.replay.guards import GUARD_MISS
from pypto_rt.replay.policy import ReplayPolicy, current_policy, policy_knobs, scope_changes
from pypto_rt.run_stats import note_replay

_knobs = config.Snapshot(config.EXECUTOR, config.STATS, config.WORKER_THREADS, *policy_knobs)
# settled specialisations one kernel keeps at once: a layer's kernel called on each layer's slice of a stacked
# pool (another storage offset: another specialisation) alternates between them every step
SETTLED_CHAIN = 4
_settings_made = (None, None, None)   # (knob values, policy scope, settings): made again when either changes


def settings() -> tuple[bool, bool, int, ReplayPolicy]:
    """(the compiled executor is in force, PYPTO_STATS=1, PYPTO_WORKER_THREADS, the replay policy in force)."""
    return settings_now()[2]


def settings_now() -> tuple:
    """(knob values, policy scope changes, `settings()`): the first two are the very objects `_knobs.values()`
    and `scope_changes()` give for as long as nothing changes (compared by identity)."""
    global _settings_made
    values, changes = _knobs.values(), scope_changes()
    made = _settings_made
    if values is not made[0] or changes is not made[1]:
        executor, stats = values[:2]
        settings = (executor == "compiled", stats == "1", config.get_int(config.WORKER_THREADS, 1) or 1,
                    current_policy())
        made = _settings_made = (values, changes, settings)   # (one assignment: others see the old or the new)
    return made



def settle(kernel, spec, match, made: tuple):
    """Install and return `kernel.state.settled`: `_replay` for arguments `match` matches, once nothing is left to
    decide for `spec` under the settings `made` (`settings_now()`, PYPTO_STATS off): the chosen function, untimed,
    called from `KernelFunction.__call__` without the driver. It gives NOT_SETTLED for other arguments and
    uninstalls itself (giving NOT_SETTLED) when a knob or policy scope changed, `spec` is no longer steady or its
    guards missed: the call then takes the driver, which decides again and installs one when it may. Arguments
    that do not match go on to the closure it replaced when that one settled another specialisation (a chain of
    at most SETTLED_CHAIN, each checking its own settings, steadiness and guards as above). A replay that
    waits to pay for a background compile (replay.tier's `due`) is settled until then: the call that reaches it
    uninstalls it (`spec` no longer steady), so the next call takes the driver, which starts the compile."""
    values, changes, (_, _, threads, policy) = made
    due = spec.tier.due(policy) if spec.tier is not None and spec.tier.chosen is None else math.inf
    state, name, knob_values, matches = kernel.state, kernel.name, _knobs.values, match.matches
    inputs = None if match.tensor_at is None else match.inputs   # (None: the arguments are the inputs)
    plain_results, warned = spec.plain_results, spec.warnings
    other = state.settled   # (another specialisation's, tried for arguments this one does not match)
    if other is not None and (getattr(other, "spec", None) is spec or getattr(other, "depth", SETTLED_CHAIN)
                              >= SETTLED_CHAIN):
        other = None

    def settled(args):
        if knob_values() is not values or scope_changes() is not changes or spec.steady is not policy:
            state.settled = None
            return NOT_SETTLED
        try:
            if not matches(args):
                return NOT_SETTLED if other is None else other(args)
        except (RuntimeError, NotImplementedError):   # (a tensor without storage or strides: binding says why)
            return NOT_SETTLED
        tier = spec.tier
        run = spec.replay if tier is None or tier.chosen is None else tier.chosen
        previous = get_num_threads()
        if previous != threads:
            set_num_threads(threads)
        try:
            outputs = run(*args) if inputs is None else run(*inputs(args))
        finally:
            if previous != threads:
                set_num_threads(previous)
        if outputs is GUARD_MISS:
            state.settled = None
            return NOT_SETTLED
        spec.hits += 1
        if spec.hits >= due:   # (paid for a compile: the driver starts it)
            spec.steady = state.settled = None
        for message, category, filename, lineno in warned:
            warnings.warn_explicit(message, category, filename, lineno)
        note_replay(name, spec.replayed if tier is None or tier.text is spec.replayed_tier else spec.standing(policy))
        return plain_results(outputs)

    settled.spec, settled.depth = spec, 1 if other is None else other.depth + 1
    state.settled = settled
    return settled
