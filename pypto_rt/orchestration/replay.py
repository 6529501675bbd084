"""Replaying entry calls: a run whose course depends only on its specialisation runs again as straight-line torch.

A *specialisation* is what a call's course can depend on besides tensor data: each tensor argument's shape,
strides, storage offset, dtypes, valid box and which arguments share memory, and every scalar argument's value.
Per specialisation, an entry call goes through three phases:
1. the first `NORMAL_RUNS` calls run on the engine as usual (the first one compiles); they are timed;
2. the next call is *recorded*: the engine runs every block on this thread (`Engine(inline=True)`, one chunk per
   coalesced loop) under a `torch_trace.Recorder`. If the recorder refuses (the run read data into Python
   other than with a `pl.read` it can repeat, communicated, printed, warned, ...), the specialisation stays on
   the engine for good;
3. later calls run the recorded torch calls as one generated function, on this thread with a worker's torch
   thread count. The next calls are a trial: replays alternate with timed engine runs (both warm, so neither is
   judged by a cold run), and after `TRIAL_REPLAYS` replays the faster way is kept for good. A specialisation
   whose engine runs all overlapped long tasks (kernel time summed over the workers `PARALLEL` times the wall time,
   tasks of `LONG_TASK_NS` on average) is not even recorded: its sequential replay would be slower.
Results are bit-identical to the engine's: the same torch calls run in the same order on the same thread count.

Data-dependent runs: numbers a run reads with `pl.read` (slot mappings, block tables, lengths, indices, scales)
are read again by each replay, at its start, from the same entry tensor (ops.traced_scalar); offsets and
operands computed from them stay code (the recorded run executes the code variant of incore_compiler.traced_code).
What the run's course depended on (an `if` on them, a loop bound, a list index) is a *guard* checked
before the replay touches any data: when one fails (the data takes another course) the call runs on the engine,
and after `MISSES` such calls a replay that misses more often than it runs is dropped. A value read from data the
run computed is read again where it was read; if the run's course depends on it, the run is not replayed.

With PYPTO_STATS=1 each replay prints one line, and a recording says what it chose and why. Not replayed: runs
with PYPTO_TRACE or PYPTO_CHECK (they observe the engine's tasks), multi-rank and communicating runs, and calls
after `MAX_SPECIALISATIONS` distinct ones of the same entry. PYPTO_REPLAY=0 turns
replay off. A replay does not see module globals reassigned after it was recorded (the host program read them
then); tensors it reads from outside (module constants) it reads by reference, so their current contents count.
"""
from __future__ import annotations

import os
import re
import sys
import time
import warnings

import torch

from pypto_rt import config
from pypto_rt.aicpu.workers import set_torch_threads
from pypto_rt.errors import InWriteWarning
from pypto_rt.ops.traced_scalar import TRACED, untraced
from pypto_rt.ops.value import TensorValue
from pypto_rt.orchestration.torch_trace import GUARD_MISS, Recorder, compile_trace, storage_id

NORMAL_RUNS = 2            # engine runs per specialisation before recording (the first compiles)
TRIAL_REPLAYS = 3          # replays timed (after one to warm up) before the faster way is chosen for good
MAX_SPECIALISATIONS = 16   # per entry; later ones run on the engine
PARALLEL = 1.5            # an engine run whose kernels add up to this much more than its wall time ran in parallel
LONG_TASK_NS = 2_000_000  # ... and pays off only with tasks this long on average (shorter: thread hand-offs dominate)
SLOWER = 1.15              # a replay this much slower than the engine's fastest run is dropped (beyond noise)
MISSES = 8                 # guard misses (data took another course) after which a replay that misses more often
                           # than it runs is dropped


class _Specialisation:
    __slots__ = ("engine_ns", "replay_ns", "replay", "off", "results", "why_not", "calls", "guards", "hits",
                 "misses", "warnings", "engine_turn", "parallel_runs")

    def __init__(self):
        self.engine_ns: list[int] = []
        self.replay_ns: list[int] = []
        self.replay = None          # the generated function, once recorded
        self.results = None         # how to rebuild the entry's return value from the function's outputs
        self.off = False            # this specialisation always runs on the engine
        self.why_not: str | None = None
        self.calls = 0              # torch calls in the replay
        self.guards = 0             # its checks of values read from data
        self.hits = 0               # replays run
        self.misses = 0             # replays whose guards failed (the engine ran the call)
        self.warnings = ()          # InWriteWarnings of the recorded run: each replay gives them again
        self.engine_turn = False    # during the trial: the next call runs on the engine (timed)
        self.parallel_runs = 0      # engine runs before recording whose tasks ran side by side

    def in_trial(self) -> bool:
        return self.replay is not None and len(self.replay_ns) <= TRIAL_REPLAYS

    def mode(self) -> str:
        """How calls of this specialisation run now, and why (PYPTO_STATS prints it)."""
        if self.replay is not None:
            guarded = f", {self.guards} guards on values read from data" if self.guards else ""
            return f"replay of {self.calls} torch calls{guarded}"
        if self.off:
            return f"engine ({self.why_not})"
        return f"engine (run {len(self.engine_ns) + 1} of {NORMAL_RUNS} before recording)"


def enabled() -> bool:
    return config.REPLAY.get() == "1" and not config.TRACE.get() and config.CHECK.get() == ""


MISS = object()


def by_arguments(kernel, args: tuple):
    """Replay straight from the caller's positional arguments when they match a recorded specialisation (skipping
    argument binding: a match has the shapes, dtypes and scalars of a call that bound without error); MISS when
    they do not."""
    table = kernel.state.replay_by_arguments
    if not table or not enabled():
        return MISS
    try:
        key = _key(args)
    except (RuntimeError, NotImplementedError):   # a tensor without storage or strides (sparse): binding says why
        return MISS
    spec = table.get(key) if key is not None else None
    if spec is None or spec.replay is None or spec.in_trial():   # (the trial alternates with the engine: `run`)
        return MISS
    return _replay(kernel, spec, [a if type(a) is torch.Tensor else None for a in args], bound=False)   # or MISS


def _remember_arguments(kernel, spec, binding, args: tuple) -> None:
    """Let `by_arguments` find `spec` from arguments like `args`: only when each argument is its bound value
    itself (a tensor bound as its own data, a scalar as itself), so the argument key decides the bound one."""
    if args is None or len(args) != len(binding.values):
        return
    for arg, value in zip(args, binding.values):
        if type(value) is TensorValue:
            if type(arg) is not torch.Tensor or value.data is not arg:
                return
        elif not (arg is value or (type(arg) is type(value) and arg == value)):
            return
    key = _key(args)
    if key is not None:
        if kernel.state.replay_by_arguments is None:
            kernel.state.replay_by_arguments = {}
        kernel.state.replay_by_arguments[key] = spec


def run(kernel, binding, run_on_engine, args: tuple | None = None):
    """Run the call bound in `binding`, by replay when its specialisation has a recording that pays;
    `run_on_engine(inline)` runs it on the engine (inline: every block on this thread) and returns its result and
    the engine's stats."""
    spec = _specialisation(kernel, binding)
    if spec is None or spec.off:
        return run_on_engine(False)[0]
    if spec.replay is not None:
        if spec.engine_turn:   # the trial: an engine run between replays, timed
            spec.engine_turn = False
            return _timed_engine_run(spec, run_on_engine)[0]
        _remember_arguments(kernel, spec, binding, args)
        out = _replay(kernel, spec, [v.data if type(v) is TensorValue else None for v in binding.values])
        if out is not MISS:
            return out
        spec.misses += 1
        if spec.misses >= MISSES and spec.misses > spec.hits:
            spec.off, spec.replay = True, None
            spec.why_not = f"the data took another course than recorded in {spec.misses} of " \
                           f"{spec.misses + spec.hits} calls"
        _stats(kernel, f"guards failed (the data takes another course): engine run; from now on {spec.mode()}")
        return run_on_engine(False)[0]
    if len(spec.engine_ns) < NORMAL_RUNS:
        result, stats = _timed_engine_run(spec, run_on_engine)
        kernel_ns, tasks = stats.get("kernel_ns", 0), stats.get("tasks", 0)
        if tasks > 1 and kernel_ns > PARALLEL * stats.get("wall_ns", 1) and kernel_ns >= LONG_TASK_NS * tasks:
            spec.parallel_runs += 1
        if spec.parallel_runs == NORMAL_RUNS:   # (every one of them: one garbage-collector pause can look parallel)
            # its tasks ran side by side on the workers: a replay, one block after another, would be slower
            spec.off, spec.why_not = True, "its tasks run in parallel on the engine's workers"
            _stats(kernel, f"from now on {spec.mode()}")
        return result
    return _record(kernel, spec, binding, run_on_engine)


def _timed_engine_run(spec: _Specialisation, run_on_engine):
    """(result, stats) of an engine run, its time noted for the choice between replay and engine."""
    t0 = time.perf_counter_ns()
    out = run_on_engine(False)
    spec.engine_ns.append(time.perf_counter_ns() - t0)
    return out


def _specialisation(kernel, binding) -> _Specialisation | None:
    key = _key(binding.values)
    if key is None:
        return None
    table = kernel.state.replay
    spec = table.get(key)
    if spec is None:
        if len(table) >= MAX_SPECIALISATIONS:
            return None
        spec = table[key] = _Specialisation()
    return spec


def _key(values) -> tuple | None:
    """The specialisation of bound values; of the caller's own arguments too (plain tensors, `by_arguments`)."""
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
    recorder = Recorder(inputs)
    threads = set_torch_threads(_worker_threads())
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
    try:
        rebuild = result_plan(result, recorder) if recorder.refused is None else None
    except Unreplayable as e:
        recorder.refuse(str(e))
    result = plain_scalars(result)
    if recorder.refused is not None:
        spec.off, spec.why_not = True, recorder.refused
    else:
        outputs = []
        spec.results = number_outputs(rebuild, outputs)
        source = recorder.source(outputs, fn_name=re.sub(r"\W", "_", f"replay_{kernel.name}"))
        spec.replay = compile_trace(source, recorder.constants, f"<pypto-rt replay of {kernel.name}>")
        spec.calls = recorder.calls
        spec.guards = recorder.guards
        _dump(kernel, source)
    _stats(kernel, f"recorded in {(time.perf_counter_ns() - t0) / 1e6:.1f} ms: from now on {spec.mode()}")
    return result


class Unreplayable(Exception):
    pass


def result_plan(result, recorder: Recorder, what: str = "the entry"):
    """`what`'s return value as a plan: tensor names from the trace, other values kept as they are."""
    if isinstance(result, TensorValue):
        name = recorder.name_of(result.data)
        if name is None:
            raise Unreplayable(f"{what} returns a tensor the trace did not make")
        return ("tensor", name, result.dtype, result.valid, result.is_tile, result.pad)
    if isinstance(result, (tuple, list)):
        return (type(result), [result_plan(r, recorder, what) for r in result])
    if result is None or type(result) in (int, float, bool, str):
        return ("value", result)
    if type(result) in TRACED:
        raise Unreplayable(f"{what} returns a value read from tensor data"
                           + ("" if what == "the entry" else " or computed from its scalar inputs"))
    raise Unreplayable(f"{what} returns a {type(result).__name__}")


def plain_scalars(result):
    """The recorded call's return value with values read from data as plain numbers."""
    if type(result) in TRACED:
        return untraced(result)
    if type(result) in (tuple, list):
        return type(result)(plain_scalars(r) for r in result)
    return result


def number_outputs(plan, outputs: list):
    """Replace tensor names by positions in the replay function's output tuple."""
    if plan[0] == "tensor":
        outputs.append(plan[1])
        return ("tensor", len(outputs) - 1) + plan[2:]
    if plan[0] == "value":
        return plan
    return (plan[0], [number_outputs(p, outputs) for p in plan[1]])


def rebuild(plan, outputs, bound: bool = True):
    """The entry's return value: TensorValues (bound) or the torch tensors the caller gets (not bound)."""
    if plan[0] == "tensor":
        _, index, dtype, valid, is_tile, pad = plan
        return TensorValue(outputs[index], dtype, valid, is_tile, pad) if bound else outputs[index]
    if plan[0] == "value":
        return plan[1]
    return plan[0](rebuild(p, outputs, bound) for p in plan[1])


_threads_knob = ("", 1)   # (PYPTO_WORKER_THREADS as read, its value): parsed once per distinct setting


def _worker_threads() -> int:
    global _threads_knob
    raw = config.WORKER_THREADS.get()
    if raw != _threads_knob[0]:
        _threads_knob = (raw, config.get_int(config.WORKER_THREADS, 1) or 1)
    return _threads_knob[1]


def _replay(kernel, spec: _Specialisation, args: list, bound: bool = True):
    """Run the recorded function on `args`; its return value as TensorValues (bound) or as the tensors the
    caller gets (from `by_arguments`)."""
    threads = set_torch_threads(_worker_threads())
    t0 = time.perf_counter_ns()
    try:
        outputs = spec.replay(*args)
    finally:
        set_torch_threads(threads)
    if outputs is GUARD_MISS:
        return MISS
    spec.hits += 1
    for message, category, filename, lineno in spec.warnings:
        warnings.warn_explicit(message, category, filename, lineno)
    if len(spec.replay_ns) <= TRIAL_REPLAYS:   # the first replay warms up (allocations): not counted
        spec.replay_ns.append(time.perf_counter_ns() - t0)
        spec.engine_turn = len(spec.replay_ns) <= TRIAL_REPLAYS
        if len(spec.replay_ns) > TRIAL_REPLAYS and min(spec.replay_ns[1:]) > SLOWER * min(spec.engine_ns):
            spec.off, spec.why_not = True, "the engine ran it faster"
            spec.replay = None
    if config.STATS.get() == "1":
        _stats(kernel, f"{spec.mode()} · wall {(time.perf_counter_ns() - t0) / 1e6:.2f} ms")
    return rebuild(spec.results, outputs, bound)


def _stats(kernel, text: str) -> None:
    if config.STATS.get() == "1":
        print(f"pypto-rt stats [{kernel.name}]: {text}", file=sys.stderr)


def _dump(kernel, source: str) -> None:
    """PYPTO_DUMP_DIR: `<file>.<entry>.replay.py` next to the host program and kernels (one file per entry: the
    latest recorded specialisation)."""
    directory = config.DUMP_DIR.get()
    if directory:
        os.makedirs(directory, exist_ok=True)
        stem = os.path.splitext(os.path.basename(kernel.fn.__code__.co_filename))[0]
        with open(os.path.join(directory, f"{stem}.{kernel.name}.replay.py"), "w") as f:
            f.write(f"# pypto-rt replay of entry '{kernel.name}': the torch calls of one recorded run\n" + source)
