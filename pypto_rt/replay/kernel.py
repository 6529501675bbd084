"""Replaying a kernel's blocks: a task runs its kernel's recorded torch calls instead of the op library's Python.

A compiled kernel calls the op library, whose checks and dispatch cost more than the torch calls they make on a
small tile (an 8x8 add: ~13 µs through the op library against ~7 µs of torch). So, as for entry calls
(replay.entry), one block of a kernel is recorded (replay.capture.Recorder, on the thread that runs it) and
later blocks run the recorded calls as one generated function. What differs:
- the kernel's number inputs (a loop index, the block index, a scalar argument) are that function's parameters:
  offsets and operands computed from them stay code, and whatever the block's course depended on (an `if`, a
  loop bound, a window's place inside its tensor) is a guard checked at its start. A block whose numbers take
  another course runs the kernel; after `kernel_misses` such blocks a replay that misses more often than it runs is
  dropped;
- a specialisation is what a block's course can depend on besides those numbers and tensor data: each tensor
  input's shape, strides, dtypes, valid box, and which inputs share memory; the number of blocks; the value of
  every other input (None, a bool, a string, a dtype, an enum; a block with a container or another object among
  its inputs runs the kernel: tensors inside it would be recorded by reference). Where a tensor lies in its
  memory is not part of it (a kernel run on each tile of a tensor the host sliced is one specialisation), unless
  the recorded block asked: then the replay first checks that each tensor input lies where it lay (storage
  offset, memory size);
- blocks are many and short, so the choice is cheap: `kernel_normal_runs` blocks run the kernel, timed by CPU
  time; the next is recorded; after `kernel_warm_replays` + `kernel_trial_replays` more, the replay is kept unless
  its fastest block took `kernel_slower` times the kernel's (fields of replay.policy.ReplayPolicy: the task runner
  hands each run's policy to the kernel replays it uses, since blocks run on worker threads).
Results are bit-identical to the kernel's: the same torch calls in the same order on the same thread.

Not replayed: communication tasks, PYPTO_CHECK runs and runs recorded for replay (replay.entry: that
recording must see the op library's course), which task_runner runs through its own paths;
kernels whose recording is refused (the recorder says why: `KernelReplays.states()` gives it, PYPTO_STATS=1
prints it), and specialisations beyond `kernel_max_specialisations` per kernel. PYPTO_KERNEL_REPLAY=0 turns it
off. PYPTO_DUMP_DIR gets each recorded block as `<file>.<kernel>.block_replay.py`.
"""
from __future__ import annotations

import enum
import os
import sys
import time
from dataclasses import dataclass
from time import thread_time_ns

from pypto_rt import config
from pypto_rt.frontend.python_calls import plain_python_calls_in
from pypto_rt.incore_compiler.kernel_ir import Unbound
from pypto_rt.language.dtypes import DataType
from pypto_rt.ops.value import TensorValue
from pypto_rt.replay.calls import storage_id
from pypto_rt.replay.capture import Recorder
from pypto_rt.replay.guards import GUARD_MISS
from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.policy import ReplayPolicy, current_policy
from pypto_rt.replay.results import Unreplayable, number_outputs, plain_scalars, rebuild, result_plan
from pypto_rt.run_stats import ENGINE, RECORDED, REFUSED, REPLAYED, ReplayDecision

_NO_RESULT = ("value", None)
_NUMBERS = frozenset((int, float))   # inputs a replay takes as parameters (any value of the kind)
_VALUES = frozenset((bool, str, bytes, Unbound, DataType))   # other inputs keyed by value (immutable, hashable)
_VALUE_KINDS = (enum.Enum,)


class _Specialisation:
    __slots__ = ("kernel_ns", "replay_ns", "replay", "steady", "results", "off", "claimed", "hits", "misses",
                 "calls", "guards")

    def __init__(self):
        self.kernel_ns: list[int] = []   # CPU time of the blocks the kernel ran before the recording
        self.replay_ns: list[int] = []   # ... of the first replays
        self.replay = None               # the generated function, once recorded
        self.steady = None               # ... once its trial is over and it is kept
        self.results = None              # how to rebuild the block's results from the function's outputs
        self.off: ReplayDecision | None = None   # set: blocks of this specialisation always run the kernel, and why
        self.claimed = False             # a thread is recording (or has recorded) a block
        self.hits = 0
        self.misses = 0
        self.calls = 0                   # torch calls in the replay
        self.guards = 0                  # its checks of the block's numbers

    def standing(self, policy: ReplayPolicy) -> ReplayDecision:
        """How this specialisation's blocks run now, and why."""
        if self.replay is not None:
            guarded = f", {self.guards} guards" if self.guards else ""
            trial = "" if self.steady is not None else " (in trial)"
            return ReplayDecision(REPLAYED, f"replay of {self.calls} torch calls{guarded}{trial}")
        if self.off is not None:
            return self.off
        if self.claimed:
            return ReplayDecision(RECORDED, "a block is being recorded")
        return ReplayDecision(ENGINE, f"block {len(self.kernel_ns) + 1} of {policy.kernel_normal_runs} run by the "
                                      "kernel before recording")


@dataclass(frozen=True)
class BlockReplayState:
    """One specialisation of a kernel's blocks: how they run now and why (`decision`), how many blocks replayed
    (`hits`) and how many found their guards failed and ran the kernel (`misses`)."""
    decision: ReplayDecision
    hits: int
    misses: int


class KernelReplays:
    """The block replays of one compiled kernel, one per specialisation; `run` is what a task runs per block."""

    def __init__(self, artifact, run_block):
        """`run_block(binding, fn, inputs, block, nblocks)` runs one block with `fn` (the kernel's run function
        or its traced variant) as the task runner does; replay runs blocks only through it."""
        self.artifact = artifact
        self._run_block = run_block
        self.policy = current_policy()   # the task runner sets the policy of the run in force (see the module text)
        self.table: dict[tuple, _Specialisation] = {}
        # (inputs, nblocks, specialisation) of a recent block: a block whose tensor inputs are the very same
        # TensorValues (immutable; the host passes the same ones to every task of a loop) and whose other inputs are
        # numbers of the same kinds, or equal, has the same specialisation
        self._last: tuple = ((), 0, None)
        self._traced_run = None   # the kernel's code variant a recorded block executes (replay.traced_code)

    def run(self, binding, inputs: tuple, block: int, nblocks: int):
        """Block `block` of `nblocks` on this thread: its replay when its specialisation has one that holds, else
        the kernel (and in time a recording)."""
        last_inputs, last_nblocks, spec = self._last
        if nblocks == last_nblocks and len(inputs) == len(last_inputs):
            for v, w in zip(inputs, last_inputs):   # the same specialisation as a recent block (see `_last`)?
                if v is not w and (type(v) is not type(w) or type(v) not in _NUMBERS):
                    spec = self._specialisation(inputs, nblocks)
                    break
        else:
            spec = self._specialisation(inputs, nblocks)
        if spec is None:
            return self._run_block(binding, self.artifact.kernel.run, inputs, block, nblocks)
        steady = spec.steady
        if steady is not None:   # the common case, kept short
            outputs = steady(block, *inputs)
            if outputs is not GUARD_MISS:
                spec.hits += 1
                return None if spec.results is _NO_RESULT else rebuild(spec.results, outputs)
            self._missed(spec)
        elif spec.replay is not None:
            outputs = self._trial(spec, inputs, block)
            if outputs is not GUARD_MISS:
                return outputs
        elif spec.off is None and not spec.claimed:
            if len(spec.kernel_ns) >= self.policy.kernel_normal_runs:
                spec.claimed = True
                return self._record(spec, binding, inputs, block, nblocks)
            start = thread_time_ns()
            out = self._run_block(binding, self.artifact.kernel.run, inputs, block, nblocks)
            spec.kernel_ns.append(thread_time_ns() - start)
            return out
        return self._run_block(binding, self.artifact.kernel.run, inputs, block, nblocks)

    def states(self) -> list[BlockReplayState]:
        """Each specialisation seen so far, in the order first seen (a snapshot)."""
        return [BlockReplayState(spec.standing(self.policy), spec.hits, spec.misses)
                for spec in list(self.table.values())]

    def forget(self) -> None:
        """Drop the inputs remembered in `_last` (at a run's end: the caller's tensors are theirs to free)."""
        self._last = ((), 0, None)

    def _specialisation(self, inputs: tuple, nblocks: int) -> _Specialisation | None:
        """The block's specialisation (made on first sight); None when it has none (see `_key`) or the kernel has
        too many. Remembered with `inputs` as `_last`."""
        key = _key(inputs, nblocks)
        spec = self.table.get(key) if key is not None else None
        if spec is None and key is not None and len(self.table) < self.policy.kernel_max_specialisations:
            spec = self.table.setdefault(key, _Specialisation())
        self._last = (inputs, nblocks, spec)
        return spec

    def _trial(self, spec: _Specialisation, inputs: tuple, block: int):
        """A replay during the trial, timed; after the policy's trial replays (and warm ones before them) the
        replay becomes steady, or is dropped when the kernel ran faster. The block's results, or GUARD_MISS."""
        replay = spec.replay   # (read once: another worker's trial may drop it meanwhile)
        if replay is None:
            return GUARD_MISS
        start = thread_time_ns()
        outputs = replay(block, *inputs)
        if outputs is GUARD_MISS:
            self._missed(spec)
            return GUARD_MISS
        spec.hits += 1
        spec.replay_ns.append(thread_time_ns() - start)
        policy = self.policy
        if len(spec.replay_ns) >= policy.kernel_warm_replays + policy.kernel_trial_replays:
            fastest = min(spec.replay_ns[policy.kernel_warm_replays:])
            if spec.kernel_ns and fastest > policy.kernel_slower * min(spec.kernel_ns):
                self._drop(spec, f"the kernel ran its blocks faster ({min(spec.kernel_ns) / 1e3:.1f} µs against "
                                 f"{fastest / 1e3:.1f} µs of CPU time)")
            else:
                spec.steady = spec.replay
        return None if spec.results is _NO_RESULT else rebuild(spec.results, outputs)

    def _missed(self, spec: _Specialisation) -> None:
        spec.misses += 1
        if spec.misses >= self.policy.kernel_misses and spec.misses > spec.hits:
            self._drop(spec, f"its inputs took another course than recorded in {spec.misses} of "
                             f"{spec.misses + spec.hits} blocks")

    def _record(self, spec: _Specialisation, binding, inputs: tuple, block: int, nblocks: int):
        """Run the block under a recorder (its number inputs traced), keep the replay unless the recording was
        refused; the block's results, as the kernel gave them."""
        t0 = time.perf_counter_ns()
        ir = self.artifact.ir
        calls = plain_python_calls_in(ir.body, ir.env, ir.file)
        if calls:
            spec.off = ReplayDecision(REFUSED, f"the kernel calls plain Python ({calls[0]}), which only the kernel "
                                               "runs")
            self._stats(spec.off, "blocks run the kernel")
            return self._run_block(binding, self.artifact.kernel.run, inputs, block, nblocks)
        recorder = Recorder([None] + [v.data if type(v) is TensorValue else None for v in inputs], self.policy)
        traced_inputs = tuple(recorder.scalar_input(i + 1, v) if type(v) in _NUMBERS else v
                              for i, v in enumerate(inputs))
        with recorder:
            result = self._run_block(binding, self._traced(), traced_inputs, recorder.scalar_input(0, block), nblocks)
        plan = None
        try:
            plan = result_plan(result, recorder, "the kernel") if recorder.refused is None else None
        except Unreplayable as e:
            recorder.refuse(str(e))
        if recorder.refused is not None:
            spec.off = ReplayDecision(REFUSED, recorder.refused)
            self._stats(spec.off, "blocks run the kernel")
            return plain_scalars(result)
        if recorder.place_read:
            recorder.pin_places()
        recorder.prologue[:0] = [f"a{i + 1} = a{i + 1}.data" for i, v in enumerate(inputs)
                                 if type(v) is TensorValue]   # (the replay takes the TensorValues themselves)
        outputs: list[str] = []
        spec.results = number_outputs(plan, outputs)
        if spec.results == _NO_RESULT:
            spec.results = _NO_RESULT   # the very object, which `run` checks by identity
        source = recorder.source(outputs, fn_name=f"{ir.name}_block")
        spec.replay = compile_trace(source, recorder.constants, f"<pypto-rt block replay of {ir.display}>")
        self._dump(source)
        spec.calls, spec.guards = recorder.calls, recorder.guards
        guards = f", {recorder.guards} guards" if recorder.guards else ""
        block = f" (a block took {min(spec.kernel_ns) / 1e6:.2f} ms)" if spec.kernel_ns else ""
        self._stats(ReplayDecision(RECORDED, f"block recorded in {(time.perf_counter_ns() - t0) / 1e6:.1f} ms{block}: "
                                             f"later blocks replay {recorder.calls} torch calls{guards}"))
        return plain_scalars(result)

    def _traced(self):
        """The kernel's traced code variant (replay.traced_code), compiled on the first recording: every
        artifact a task runs comes from `host_program` or `incore_kernel`, which say how to get it."""
        if self._traced_run is None:
            self._traced_run = self.artifact.traced_variant().kernel.run
        return self._traced_run

    def _drop(self, spec: _Specialisation, why: str) -> None:
        spec.off, spec.replay, spec.steady = ReplayDecision(ENGINE, why), None, None
        self._stats(spec.off, "block replay dropped")

    def _stats(self, decision: ReplayDecision, after: str = "") -> None:
        """PYPTO_STATS=1: `pypto-rt stats [kernel '<name>']: <kind>: <reason>[ · <after>]`."""
        if config.STATS.get() == "1":
            tail = f" · {after}" if after else ""
            print(f"pypto-rt stats [kernel '{self.artifact.ir.display}']: {decision}{tail}", file=sys.stderr)

    def _dump(self, source: str) -> None:
        directory = config.DUMP_DIR.get()
        if directory:
            ir = self.artifact.ir
            os.makedirs(directory, exist_ok=True)
            stem = os.path.splitext(os.path.basename(ir.file))[0]
            with open(os.path.join(directory, f"{stem}.{ir.name}.block_replay.py"), "w") as f:
                f.write(f"# pypto-rt replay of one block of kernel '{ir.display}' ({ir.span}): its recorded torch "
                        "calls; a0 is the block index, a1... the kernel's inputs\n" + source)


def _key(inputs: tuple, nblocks: int) -> tuple | None:
    """A block's specialisation (see the module text); None when an input cannot be keyed (unhashable)."""
    parts: list = [nblocks]
    storages: dict[int, int] = {}
    for v in inputs:
        kind = type(v)
        if kind is TensorValue:
            t = v.data
            parts.append((t.shape, t.stride(), t.dtype, v.dtype, v.valid, v.is_tile, v.pad,
                          storages.setdefault(storage_id(t), len(storages))))
        elif kind in _NUMBERS:
            parts.append(kind)
        elif v is None or kind in _VALUES or isinstance(v, _VALUE_KINDS):
            parts.append((kind, v))
        else:   # a container or an object: tensors inside it would be recorded as outside tensors, by reference
            return None
    return tuple(parts)
