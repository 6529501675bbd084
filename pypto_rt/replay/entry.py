"""Replaying entry calls: a run whose course depends only on its specialisation runs again as straight-line torch.

A *specialisation* is what a call's course can depend on besides tensor data: each tensor argument's shape,
strides, storage offset, dtypes, valid box and which arguments share memory, and every scalar argument's value.
Per specialisation, an entry call goes through three phases:
1. the first `normal_runs` calls run on the engine as usual (the first one compiles); they are timed;
2. the next call is *recorded*: the engine runs every block on this thread (`Engine(inline=True)`, one chunk per
   coalesced loop) under a `replay.capture.Recorder`. If the recorder refuses (the run read data into Python
   other than with a `pl.read` it can repeat, communicated on the host, printed, warned, ...), the
   specialisation stays on the engine for good;
3. later calls run the recorded torch calls as one generated function, on this thread with a worker's torch
   thread count. The next calls are a trial: replays alternate with timed engine runs (both warm, so neither is
   judged by a cold run), and after `trial_replays` replays the faster way is kept for good. A specialisation
   whose engine runs all overlapped long tasks (kernel time summed over the workers `parallel` times the wall time,
   tasks of `long_task_ns` on average) is not even recorded: its sequential replay would be slower.
Results are bit-identical to the engine's: the same torch calls run in the same order on the same thread count.
A kept replay that keeps running may be compiled by the torch compiler and swapped in (replay.tier, PYPTO_TIER):
then floats may differ from the engine's in their last bits.

Data-dependent runs: numbers a run reads with `pl.read` (slot mappings, block tables, lengths, indices, scales)
are read again by each replay, at its start, from the same entry tensor (replay.scalars); offsets and
operands computed from them stay code (the recorded run executes the code variant of replay.traced_code).
What the run's course depended on (an `if` on them, a loop bound, a list index) is a *guard* checked
before the replay touches any data: when one fails (the data takes another course) the call runs on the engine,
and after `misses` such calls a replay that misses more often than it runs is dropped. A value read from data the
run computed is read again where it was read; if the host program's course depends on it, the run is not replayed.

Blocks called as they are (replay.opaque): a recording refused inside a block (its course depends on data the run
computed, or it reads data into Python: a guard would come too late) is made again on the next call with that
kernel's blocks recorded as opaque calls of the kernel, so the rest of the run still replays as torch calls. The
rule for guards made inside a block on data it reads itself from an entry tensor (a row loop bounded by counts):
they are kept, since the block's torch calls replay fastest while its data keeps its course; when the replay is
dropped for misses, the specialisation is recorded again with the blocks that made guards called as they are
(their course then follows the data with no guard). Up to `max_recordings` recordings per specialisation.

Communicating runs: each block of a communication task that calls a `pld` op is recorded op by op, its signals and
stores as calls of their effects (replay.comm_block), or, where that is refused inside it, as one opaque call of
its kernel (a task that only takes windows is recorded as torch calls on the windows' memory, after the waits
before it in the straight line), which the replay calls again with its inputs as code:
an epoch or a row count read with `pl.read` changes per replay, and what the block writes is data the run
computed. Windows are volatile (peers write them at any time): numbers read from them are read where the run read
them, never in the prologue. Each rank decides alone: one rank may replay a call while another runs it on the
engine, and both are correct, since either way the rank's communication runs in its program order (the engine's
comm chain, the replay's straight line, which runs as a one-worker engine would) and peers meet it only through
windows and signals. A communicating
run's replay is kept without a trial: the times of both ways are dominated by waits for peers (noise that the
slowest peer, replaying or not, makes), and the engine wins only by overlapping long tasks on its workers, which
the check before recording catches (waits that overlap other tasks count as overlap: a replay would serialise
them). A wait that times out inside a replay gives the usual multi-rank wait report (rank, region label, cell,
values, peers).

The limits are fields of the policy in force (replay.policy). Every call notes how it ran as a typed
`run_stats.ReplayDecision` (replayed, recorded, engine, guard_miss, refused, disabled, with a reason); with
PYPTO_STATS=1 replays, recordings, misses and a specialisation leaving replay for good print theirs as
`pypto-rt stats [<entry>]: <kind>: <reason>`. Not replayed: runs with PYPTO_TRACE or PYPTO_CHECK (they observe
the engine's tasks), runs with `pld` ops on the host itself (outside any region), and calls after
`max_specialisations` distinct ones of the same entry. PYPTO_REPLAY=0 turns replay off. A replay does not see
module globals reassigned after it was recorded (the host program read them then); tensors it reads from outside
(module constants) it reads by reference, so their current contents count.
"""
from __future__ import annotations

import os
import re
import sys
import time
import warnings

import torch
from torch import get_num_threads, set_num_threads

from pypto_rt import config
from pypto_rt.aicpu.workers import set_torch_threads
from pypto_rt.errors import InWriteWarning
from pypto_rt.kernel_state import NOT_SETTLED
from pypto_rt.ops.value import TensorValue
from pypto_rt.replay.arguments import ArgumentMatch
from pypto_rt.replay.calls import storage_id
from pypto_rt.replay.capture import Recorder
from pypto_rt.replay.guards import GUARD_MISS
from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.policy import ReplayPolicy, current_policy
from pypto_rt.replay.settled import settings, settings_now, settle
from pypto_rt.replay.tier import Tier
from pypto_rt.replay.tier_family import Families
from pypto_rt.replay.results import Unreplayable, number_outputs, plain_rebuilder, plain_scalars, rebuild, result_plan
from pypto_rt.run_stats import DISABLED, ENGINE, RECORDED, REFUSED, REPLAYED, ReplayDecision, note_replay
from pypto_rt.run_stats import GUARD_MISS as GUARD_MISS_KIND



class _Specialisation:
    __slots__ = ("engine_ns", "replay_ns", "replay", "off", "results", "plain_results", "calls", "guards", "hits",
                 "misses", "warnings", "engine_turn", "parallel_runs", "replayed", "opaque", "opaque_kernels",
                 "recordings", "communicates", "block_guards", "tier", "replayed_tier", "steady")

    def __init__(self):
        self.engine_ns: list[int] = []
        self.replay_ns: list[int] = []
        self.replay = None          # the generated function, once recorded
        self.results = None         # how to rebuild the entry's return value from the function's outputs
        self.plain_results = None   # ... as the caller gets it, one function (results.plain_rebuilder)
        self.off: ReplayDecision | None = None   # set: this specialisation always runs on the engine, and why
        self.calls = 0              # torch calls in the replay
        self.guards = 0             # its checks of values read from data
        self.hits = 0               # replays run
        self.misses = 0             # replays whose guards failed (the engine ran the call)
        self.warnings = ()          # InWriteWarnings of the recorded run: each replay gives them again
        self.engine_turn = False    # during the trial: the next call runs on the engine (timed)
        self.parallel_runs = 0      # engine runs before recording whose tasks ran side by side
        self.replayed: ReplayDecision | None = None   # what a replay notes (made once: replays are the hot path)
        self.opaque = 0             # blocks the replay calls as they are (replay.opaque)
        self.communicates = False   # ... some of them communication blocks: no timed trial (see the module text)
        self.opaque_kernels: set = set()   # kernels whose blocks the next recording calls as they are
        self.recordings = 0         # recordings made (a refusal inside a block may lead to another)
        self.block_guards: set = set()     # kernels whose blocks made guards in the recording
        self.tier: Tier | None = None      # the replay's compiled tier (replay.tier), once recorded
        self.replayed_tier = ""            # the tier text `replayed` was made with
        self.steady = None          # the policy under which nothing is left to decide: replay.settled (else None)

    def in_trial(self, policy: ReplayPolicy) -> bool:
        return self.replay is not None and not self.communicates and len(self.replay_ns) <= policy.trial_replays

    def standing(self, policy: ReplayPolicy) -> ReplayDecision:
        """How the next call of this specialisation runs, and why."""
        if self.replay is not None:
            tier = self.tier.text if self.tier is not None else ""
            if self.replayed is None or tier is not self.replayed_tier:
                guarded = f", {self.guards} guards on values read from data" if self.guards else ""
                blocks = f" and {self.opaque} kernel blocks called as they are" if self.opaque else ""
                self.replayed = ReplayDecision(REPLAYED, f"replay of {self.calls - self.opaque} torch calls{blocks}"
                                                         f"{guarded}{' · ' + tier if tier else ''}")
                self.replayed_tier = tier
            return self.replayed
        if self.off is not None:
            return self.off
        if self.recordings:
            return ReplayDecision(ENGINE, f"recording again, with the blocks of {len(self.opaque_kernels)} kernels "
                                          "called as they are")
        return ReplayDecision(ENGINE, f"run {len(self.engine_ns) + 1} of {policy.normal_runs} before recording")


def decisions(kernel) -> list[ReplayDecision]:
    """How the next call of each specialisation of entry `kernel` seen so far would run, in the order first seen."""
    policy = current_policy()
    return [spec.standing(policy) for spec in kernel.state.replay.values()]


def disabled() -> ReplayDecision | None:
    """Why replay is off for calls made here (PYPTO_REPLAY=0, PYPTO_TRACE, PYPTO_CHECK, a policy_scope); None when
    it is on."""
    if current_policy().enabled:
        return None
    if config.REPLAY.get() != "1":
        return ReplayDecision(DISABLED, "PYPTO_REPLAY=0")
    if config.TRACE.get():
        return ReplayDecision(DISABLED, "PYPTO_TRACE is set (the trace shows the engine's tasks)")
    if config.CHECK.get():
        return ReplayDecision(DISABLED, f"PYPTO_CHECK={config.CHECK.get()} (every task is checked on the engine)")
    return ReplayDecision(DISABLED, "policy_scope(enabled=False)")


MISS = object()


def by_arguments(kernel, args: tuple):
    """Replay straight from the caller's positional arguments when they match a recorded specialisation (skipping
    argument binding: a match has the shapes, dtypes and scalars of a call that bound without error); MISS when
    they do not, or when the compiled executor is not the one in force."""
    matches = kernel.state.replay_by_arguments
    if not matches:
        return MISS
    made = settings_now()
    compiled, stats, threads, policy = made[2]
    if not compiled or not policy.enabled:
        return MISS
    try:
        match, spec = matches[0]   # (the last one matched)
        if not match.matches(args):
            match, spec = _matched(kernel, matches, args)
    except (RuntimeError, NotImplementedError):   # a tensor without storage or strides (sparse): binding says why
        return MISS
    if spec is None:
        return MISS
    if spec.steady is policy and not stats:   # (from now on `KernelFunction.__call__` calls it without the driver)
        result = settle(kernel, spec, match, made)(args)
        return MISS if result is NOT_SETTLED else result
    if spec.replay is None or spec.in_trial(policy):   # (the trial alternates: `run`)
        return MISS
    return _replay(kernel, spec, policy, match.inputs(args), stats, threads, bound=False)


def _matched(kernel, matches: list, args: tuple) -> tuple:
    """(the ArgumentMatch, its specialisation) after the first (tried already) that `args` match, or (None, None).
    The one found goes first in a new list (lists are replaced, never changed: other threads may be reading)."""
    for i in range(1, len(matches)):
        match, spec = matches[i]
        if match.matches(args):
            kernel.state.replay_by_arguments = [matches[i]] + matches[:i] + matches[i + 1:]
            return match, spec
    return None, None


def _remember_arguments(kernel, spec, binding, args: tuple, policy: ReplayPolicy) -> None:
    """Let `by_arguments` find `spec` from arguments like `args`: only when each argument is its bound value
    itself (a tensor bound as its own data, a scalar as itself), so the arguments decide the bound key."""
    if args is None or len(args) != len(binding.values):
        return
    for arg, value in zip(args, binding.values):
        if type(value) is TensorValue:
            if type(arg) is not torch.Tensor or value.data is not arg:
                return
        elif not (arg is value or (type(arg) is type(value) and arg == value)):
            return
    matches = kernel.state.replay_by_arguments or []
    if any(s is spec and m.matches(args) for m, s in matches):
        return
    match = ArgumentMatch.of(args)
    if match is not None:
        kernel.state.replay_by_arguments = [(match, spec)] + matches[:policy.max_specialisations - 1]


def run(kernel, binding, run_on_engine, args: tuple | None = None):
    """Run the call bound in `binding`, by replay when its specialisation has a recording that pays;
    `run_on_engine(inline)` runs it on the engine (inline: every block on this thread) and returns its result and
    the engine's stats. Notes its ReplayDecision (run_stats)."""
    policy = current_policy()
    spec, why_none = _specialisation(kernel, binding, policy)
    if spec is None:
        return _on_engine(kernel, run_on_engine, ReplayDecision(DISABLED, why_none))
    if spec.off is not None:
        return _on_engine(kernel, run_on_engine, spec.off)
    if spec.replay is not None:
        if spec.engine_turn:   # the trial: an engine run between replays, timed
            spec.engine_turn = False
            _decided(kernel, ReplayDecision(ENGINE, "trial turn: an engine run between replays, timed"))
            return _timed_engine_run(spec, run_on_engine)[0]
        _remember_arguments(kernel, spec, binding, args, policy)
        _, stats, threads, _ = settings()
        out = _replay(kernel, spec, policy, [v.data if type(v) is TensorValue else None for v in binding.values],
                      stats, threads)
        if out is not MISS:
            return out
        return _missed(kernel, spec, policy, run_on_engine)
    if len(spec.engine_ns) < policy.normal_runs:
        return _normal_run(kernel, spec, policy, run_on_engine)
    return _record(kernel, spec, binding, run_on_engine)


def _on_engine(kernel, run_on_engine, decision: ReplayDecision):
    _decided(kernel, decision)
    return run_on_engine(False)[0]


def _normal_run(kernel, spec: _Specialisation, policy: ReplayPolicy, run_on_engine):
    """One of the timed engine runs before recording; a specialisation whose runs all overlapped long tasks is not
    recorded: its replay, one block after another, would be slower."""
    decision = spec.standing(policy)
    result, stats = _timed_engine_run(spec, run_on_engine)
    kernel_ns, tasks = stats.get("kernel_ns", 0), stats.get("tasks", 0)
    if tasks > 1 and kernel_ns > policy.parallel * stats.get("wall_ns", 1) and \
            kernel_ns >= policy.long_task_ns * tasks:
        spec.parallel_runs += 1
    if spec.parallel_runs == policy.normal_runs:   # (every one: one garbage-collector pause can look parallel)
        spec.off = decision = ReplayDecision(ENGINE, "its tasks run in parallel on the engine's workers")
        _decided(kernel, decision, " (from now on)")
    else:
        _decided(kernel, decision)
    return result


def _missed(kernel, spec: _Specialisation, policy: ReplayPolicy, run_on_engine):
    """The replay's guards failed (the data takes another course): the engine runs the call; a replay that
    misses more often than it runs is dropped after `policy.misses` misses."""
    spec.misses += 1
    if spec.misses >= policy.misses and spec.misses > spec.hits and not _record_again(spec, spec.block_guards,
                                                                                        policy):
        spec.off = ReplayDecision(ENGINE, f"the data took another course than recorded in {spec.misses} of "
                                          f"{spec.misses + spec.hits} calls")
        spec.replay = spec.steady = None
    standing = spec.standing(policy)
    _decided(kernel, ReplayDecision(GUARD_MISS_KIND, "guards failed (the data takes another course): engine "
                                                     f"run; from now on {standing}"), "")
    return run_on_engine(False)[0]


def _timed_engine_run(spec: _Specialisation, run_on_engine):
    """(result, stats) of an engine run, its time noted for the choice between replay and engine."""
    t0 = time.perf_counter_ns()
    out = run_on_engine(False)
    spec.engine_ns.append(time.perf_counter_ns() - t0)
    return out


def _specialisation(kernel, binding, policy: ReplayPolicy) -> tuple[_Specialisation | None, str]:
    """The call's specialisation (made on first sight), or None and why it has none."""
    key = _key(binding.values)
    if key is None:
        return None, "an argument of a kind replay cannot key a specialisation on"
    table = kernel.state.replay
    spec = table.get(key)
    if spec is None:
        if len(table) >= policy.max_specialisations:
            return None, f"the entry has {len(table)} specialisations already (policy.max_specialisations)"
        spec = table[key] = _Specialisation()
    return spec, ""


def _key(values) -> tuple | None:
    """The specialisation of bound values (`by_arguments` finds one from the caller's own arguments by an
    ArgumentMatch, which holds only where this key would be equal)."""
    parts, storages = [], {}
    for v in values:
        kind = type(v)
        if kind is TensorValue or kind is torch.Tensor:
            t = v.data if kind is TensorValue else v
            group = storages.setdefault(storage_id(t), len(storages))
            parts.append((t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, group) + (
                (v.dtype, v.valid, v.is_tile, v.pad) if kind is TensorValue else ()))
        elif v is None or kind in (int, float, bool, str):
            parts.append((type(v), v))
        elif getattr(type(v), "__pypto_program__", False):   # a @pl.program method's `self`: by identity
            parts.append((type(v), id(v), v))
        else:
            return None   # an argument of another kind: no specialisation to key on
    return tuple(parts)


def _record(kernel, spec: _Specialisation, binding, run_on_engine):
    t0 = time.perf_counter_ns()
    inputs = [v.data if type(v) is TensorValue else None for v in binding.values]
    recorder = Recorder(inputs, opaque_kernels=frozenset(spec.opaque_kernels))
    spec.recordings += 1
    result = _run_recorded(recorder, spec, run_on_engine)
    try:
        rebuild = result_plan(result, recorder) if recorder.refused is None else None
    except Unreplayable as e:
        recorder.refuse(str(e))
    result = plain_scalars(result)
    took = f"{(time.perf_counter_ns() - t0) / 1e6:.1f} ms"
    if recorder.refused is not None and _record_again(spec, set(recorder.escaped), current_policy()):
        _decided(kernel, ReplayDecision(ENGINE, f"recorded in {took} and refused inside a block: "
                                                f"{recorder.refused}; the next call records again, calling the "
                                                f"blocks of {len(spec.opaque_kernels)} kernels as they are"), "")
        return result
    if recorder.refused is not None:
        spec.off = ReplayDecision(REFUSED, recorder.refused)
        _decided(kernel, spec.off, f" · recorded in {took}: from now on on the engine")
        return result
    outputs = []
    spec.results = number_outputs(rebuild, outputs)
    spec.plain_results = plain_rebuilder(spec.results)
    source = recorder.source(outputs, fn_name=re.sub(r"\W", "_", f"replay_{kernel.name}"))
    spec.replay = compile_trace(source, recorder.constants, f"<pypto-rt replay of {kernel.name}>")
    spec.calls, spec.guards, spec.opaque = recorder.calls, recorder.guards, recorder.opaque_calls
    spec.communicates = recorder.communicates
    spec.block_guards = recorder.block_guards
    if kernel.state.tier_families is None:
        kernel.state.tier_families = Families()
    spec.tier = Tier(kernel.name, source, recorder.constants, _untierable(spec), kernel.state.tier_families)
    _dump(kernel, source)
    _decided(kernel, ReplayDecision(RECORDED, f"in {took}; from now on {spec.standing(current_policy()).reason}"),
             "")
    return result


def _untierable(spec: _Specialisation) -> str | None:
    """Why the replay is not compiled (replay.tier), or None."""
    if spec.opaque:
        return f"it calls {spec.opaque} kernel blocks as they are"
    if spec.communicates:
        return "it communicates: its window signals and stores run in order between its torch calls"
    return None


def _record_again(spec: _Specialisation, kernels: set, policy: ReplayPolicy) -> bool:
    """Whether the next call records again, with the blocks of `kernels` (keys: replay.capture `block`) called as
    they are: only with kernels not called so yet, up to `policy.max_recordings` recordings."""
    if not kernels - spec.opaque_kernels or spec.recordings >= policy.max_recordings:
        return False
    spec.opaque_kernels |= kernels
    spec.replay, spec.replayed, spec.hits, spec.misses, spec.tier, spec.steady = None, None, 0, 0, None, None
    spec.replay_ns, spec.engine_turn = [], False   # (the new recording gets a trial of its own)
    return True


def _run_recorded(recorder, spec: _Specialisation, run_on_engine):
    """The recorded run's result, its warnings given again as they would have appeared (an InWriteWarning is kept
    for each replay to give again; any other refuses the recording)."""
    threads = set_torch_threads(settings()[2])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with recorder:
                result = run_on_engine(True)[0]
    finally:
        set_torch_threads(threads)
    for w in caught:   # the run's own warnings, as they would have appeared
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    # an InWriteWarning is about the kernel's code (decided by the specialisation): each replay gives it again
    spec.warnings = [(w.message, w.category, w.filename, w.lineno) for w in caught
                     if issubclass(w.category, InWriteWarning)]
    if len(spec.warnings) < len(caught):
        other = next(w for w in caught if not issubclass(w.category, InWriteWarning))
        recorder.refuse(f"the run warned ({other.category.__name__})")
    return result


def _replay(kernel, spec: _Specialisation, policy: ReplayPolicy, args: list, stats: bool, threads: int,
            bound: bool = True):
    """Run the recorded function on `args` with `threads` torch threads (`stats`: PYPTO_STATS=1); its return value
    as TensorValues (bound) or as the tensors the caller gets (from `by_arguments`)."""
    previous = get_num_threads()   # (set_torch_threads, inline: a replayed call is the hot path)
    if previous != threads:
        set_num_threads(threads)
    tier = spec.tier
    try:
        if tier is None or tier.chosen is not None:
            run = spec.replay if tier is None else tier.chosen
        else:   # (steady: kept after the engine trial, and paid for a compile: replay.tier's `due`)
            steady = not spec.in_trial(policy) and spec.hits >= tier.due(policy)
            run = tier.pick(spec.replay, args, steady, policy)
        t0 = time.perf_counter_ns()
        outputs = run(*args)
        if tier is not None and tier.chosen is None:
            tier.timed(run, time.perf_counter_ns() - t0, spec.replay, policy)
    finally:
        if previous != threads:
            set_num_threads(previous)
    if outputs is GUARD_MISS:
        return MISS
    spec.hits += 1
    for message, category, filename, lineno in spec.warnings:
        warnings.warn_explicit(message, category, filename, lineno)
    decision = spec.standing(policy)
    if spec.in_trial(policy):   # the first replay warms up (allocations): not counted
        spec.replay_ns.append(time.perf_counter_ns() - t0)
        spec.engine_turn = len(spec.replay_ns) <= policy.trial_replays
        timed = spec.replay_ns[1:]   # (none with a trial of no replays; no engine run with `normal_runs` 0)
        if len(spec.replay_ns) > policy.trial_replays and timed and spec.engine_ns and \
                min(timed) > policy.slower * min(spec.engine_ns):
            spec.off, spec.replay, spec.steady = ReplayDecision(ENGINE, "the engine ran it faster"), None, None
    if stats:
        _decided(kernel, decision, f" · wall {(time.perf_counter_ns() - t0) / 1e6:.2f} ms")
    else:
        note_replay(kernel.name, decision)
    if spec.replay is not None and not spec.in_trial(policy) and (tier is None or tier.settled(policy, spec.hits)):
        spec.steady = policy
    return rebuild(spec.results, outputs) if bound else spec.plain_results(outputs)


def _decided(kernel, decision: ReplayDecision, printed: str | None = None) -> None:
    """Note how the call ran (run_stats); with PYPTO_STATS=1 print it too when `printed` is given (the text
    after it: a replay's wall time), as `pypto-rt stats [<entry>]: <kind>: <reason>...`."""
    note_replay(kernel.name, decision)
    if printed is not None and config.STATS.get() == "1":
        print(f"pypto-rt stats [{kernel.name}]: {decision}{printed}", file=sys.stderr)


def _dump(kernel, source: str) -> None:
    """PYPTO_DUMP_DIR: `<file>.<entry>.replay.py` next to the host program and kernels (one file per entry: the
    latest recorded specialisation)."""
    directory = config.DUMP_DIR.get()
    if directory:
        os.makedirs(directory, exist_ok=True)
        stem = os.path.splitext(os.path.basename(kernel.fn.__code__.co_filename))[0]
        with open(os.path.join(directory, f"{stem}.{kernel.name}.replay.py"), "w") as f:
            f.write(f"# pypto-rt replay of entry '{kernel.name}': the torch calls of one recorded run\n" + source)
