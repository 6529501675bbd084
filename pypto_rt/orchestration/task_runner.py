"""What a worker runs for a task: one block of a compiled kernel, with errors placed at the user's line.

A block runs its kernel's recorded torch calls once the kernel has a replay for the block's specialisation
(replay.kernel; PYPTO_KERNEL_REPLAY=0: always the kernel itself). A short kernel's tasks may run on
the host thread itself when nothing else is in flight (`_AtOnce`, `Engine.run_now`).

With `PYPTO_CHECK=reference` a task also runs its region eagerly on the op library (every `pl` call
through the reference executor), on copies of its inputs taken when it starts, and fails at the
first region whose outputs differ beyond the tolerance — naming the region, the tensor and the
worst element. Blocks of a checked task run one after another, so the copies stay consistent.

With PYPTO_DETERMINISTIC=1 a task of several blocks (its kernel may add atomically: `pl.assemble(..., atomic=Add)`)
runs as an `_OrderedRun` (communication tasks too): each block's atomic adds are kept (ops.accumulate.collecting)
and the block that finishes last applies all of them in block order, so the sums come out as a one-worker run's
whatever order the blocks finish in; no block waits for another. (The host puts tasks in program order: host.py
`_atomic_adds`.) A run recorded for replay runs its blocks one after another on one thread, in block order: it
needs none of this.

A communication task (the host passes its region name as `label`) runs with that label set for its thread
(`pypto_rt.collective.process.set_label`), so a `pld.system.wait` that times out names the region it was in; it
always runs on a worker (never inline on the host, which must keep submitting in program order). Other tasks pay
nothing for this.

In a run recorded for replay (on the host thread, under a replay.capture.Recorder), each block of a communication
task that calls `pld` ops runs *signalling*: its torch calls and `pld` ops are recorded as calls
(replay.comm_block); once a recording refused that for its kernel, and for a kernel whose course an earlier
recording found to depend on data, each block is run by the recorder as one `BlockCall` (the kernel's own run
function) that the replay calls again (replay.opaque); other blocks run their kernel with the recorder told which
kernel runs (`recorder.block`). A task that only takes windows (reads or writes them with plain ops, after the
signal waits of earlier tasks) is recorded as torch calls too: a window keeps its memory, so its recorded calls read
the peers' latest rows where the replay's straight line runs them, after those waits (numbers read from a window
stay volatile: replay.capture).
"""
from __future__ import annotations

import threading
from time import thread_time_ns

import torch

from pypto_rt import config
from pypto_rt.binding import Binding
from pypto_rt.collective import process
from pypto_rt.errors import PyptoError
from pypto_rt.incore_compiler.compiler import BACKENDS
from pypto_rt.ops import accumulate, recording
from pypto_rt.ops.value import TensorValue
from pypto_rt.orchestration.block import run_block
from pypto_rt.replay.kernel import KernelReplays
from pypto_rt.replay.policy import current_policy
from pypto_rt.replay.scalars import untraced

OUTLIER = 10   # a block this many times the average is left out of a kernel's RunHistory unless the next one is too
CHECK_TOL = config.CHECK_TOL
SIGNALS_REFUSED = "signals_refused"   # on a kernel whose signalling blocks a recording refused: why


class CheckMismatchError(PyptoError):
    """PYPTO_CHECK=reference: a region's compiled outputs differ from the op library's."""


class TaskRunner:
    def __init__(self, binding, check: bool):
        self.binding = binding
        self.check = check
        self.tolerance = float(CHECK_TOL.get()) if check else 0.0
        self.inline_ns = (config.get_int(config.HOST_INLINE_US, 0) or 0) * 1000
        # (a run recorded for replay must see every op's course: its blocks run their kernels)
        self.replay_policy = current_policy()   # (kernel replays decide on worker threads: they get this one)
        self.recorder = recording.current()   # the recorder of a run recorded for replay (on this, the host thread)
        self.kernel_replay = self.replay_policy.kernel_replay and self.recorder is None
        self.ordered_adds = config.DETERMINISTIC.get() == "1" and self.recorder is None
        self.replays_used: dict[int, KernelReplays] = {}

    def at_once(self, artifact) -> "_AtOnce | None":
        """How the host runs a task of `artifact` by itself (`Engine.run_now`), when the engine lets it; None when
        it never does in this run (PYPTO_CHECK runs go through `_CheckedRun`)."""
        if self.check:
            return None
        return _AtOnce(self.binding, self._body(artifact), artifact.__dict__.setdefault("history", RunHistory()),
                       self.inline_ns)

    def runner(self, artifact, inputs: tuple, blocks: int, accesses, label: str | None = None,
               signals: bool = True) -> "_Run":
        """What the engine runs per block; `label`: a communication task's region name (for wait reports);
        `signals`: its kernel calls `pld` ops (False: it only takes windows, and a recording records its torch
        calls, which read and write the windows' memory where the replay runs them, in program order)."""
        if self.check:
            run = _CheckedRun(self, artifact, inputs, blocks, accesses)
            run.label = label
            return run
        history = artifact.__dict__.setdefault("history", RunHistory())
        if label is not None and signals and self.recorder is not None:
            if id(artifact) in self.recorder.opaque_kernels or SIGNALS_REFUSED in artifact.__dict__:
                # (the recorder runs it as one call: replay.opaque)
                return _Run(self.binding, _opaque_body(self.recorder, artifact, label), inputs, blocks, history, False)
            return _CommRun(self.binding, _signalling_body(self.recorder, artifact), inputs, blocks, history, False,
                            label)
        if label is not None:   # (recorded: its kernel watched by the recorder, or called as it is)
            body = _kernel_body(artifact.kernel.run) if self.recorder is None else self._body(artifact)
            run = _CommRun(self.binding, body, inputs, blocks, history, False, label)
        else:
            run = _Run(self.binding, self._body(artifact), inputs, blocks, history, history.short(self.inline_ns))
        return _OrderedRun(run) if self.ordered_adds and blocks > 1 else run   # (a helper it calls may add, too)

    def _body(self, artifact):
        """What runs one block of `artifact`'s kernel, `body(binding, inputs, block, nblocks)`: its block replays
        (replay.kernel), or the kernel itself; in a run recorded for replay, the kernel watched by the recorder, or
        an opaque call of it when an earlier recording found its course depends on data (replay.entry)."""
        if self.recorder is not None:
            if id(artifact) in self.recorder.opaque_kernels:
                return _opaque_body(self.recorder, artifact, None)
            return _watched_body(self.recorder, artifact)
        if not self.kernel_replay:
            return _kernel_body(artifact.kernel.run)
        replays = kernel_replays(artifact)
        if replays is None:
            replays = artifact.__dict__.setdefault("kernel_replays", KernelReplays(artifact, run_block))
        self.replays_used[id(replays)] = replays
        replays.policy = self.replay_policy
        return replays.run

    def forget_inputs(self) -> None:
        """The run is over: the kernel replays it used let go of its tensors (see `KernelReplays.forget`)."""
        for replays in self.replays_used.values():
            replays.forget()


def kernel_replays(artifact) -> KernelReplays | None:
    """The block replays of `artifact`'s kernel (`.states()`: how each specialisation runs); None before a run
    with kernel replay on used them."""
    return artifact.__dict__.get("kernel_replays")


def _kernel_body(fn):
    return lambda binding, inputs, block, nblocks: run_block(binding, fn, inputs, block, nblocks)


class _AtOnce:
    """A kernel's tasks as `Engine.run_now` runs them: `host_ok` when its blocks are short (`Engine.runs_at_once`
    asks), `blocks(inputs, n)` what runs per block, `ran(task)` notes the task's time when it was long (nothing else
    ran meanwhile: its wall time is CPU time)."""
    __slots__ = ("binding", "body", "history", "limit_ns")

    def __init__(self, binding, body, history: "RunHistory", limit_ns: int):
        self.binding, self.body, self.history, self.limit_ns = binding, body, history, limit_ns

    @property
    def host_ok(self) -> bool:
        return self.history.short(self.limit_ns)

    def blocks(self, inputs: tuple, nblocks: int):
        binding, body = self.binding, self.body
        return lambda block: body(binding, inputs, block, nblocks)

    def ran(self, task) -> None:
        ns = task.t_end - task.t_start
        if ns >= self.limit_ns:   # (a short block would keep the short average short: no need to note it)
            self.history.note(ns)


class RunHistory:
    """How much CPU a kernel's blocks take (a moving average, so a cold first run fades): the engine lets the
    host run kernels that are short, which saves two thread hand-offs per task. A lone block far longer than the
    average (the one that records the kernel's replay, a garbage-collector pause) is left out; two in a row count:
    the kernel has become slow."""
    __slots__ = ("runs", "average_ns", "outlier")

    def __init__(self):
        self.runs = 0
        self.average_ns = 0.0
        self.outlier = False

    def short(self, limit_ns: int) -> bool:
        return self.runs > 0 and self.average_ns < limit_ns

    def note(self, ns: int) -> None:
        if self.runs and ns > OUTLIER * self.average_ns and not self.outlier:
            self.outlier = True
            return
        self.outlier = False
        self.average_ns = ns if self.runs == 0 else 0.5 * (self.average_ns + ns)
        self.runs += 1


class _Run:
    """run(block): one block on the calling thread (a worker, or the host for a short kernel: `host_ok`)."""
    __slots__ = ("binding", "body", "inputs", "blocks", "nblocks", "history", "host_ok")

    def __init__(self, binding, body, inputs, blocks, history, host_ok):
        self.binding, self.body, self.inputs, self.blocks, self.nblocks = binding, body, inputs, blocks, blocks
        self.history, self.host_ok = history, host_ok

    def __call__(self, block: int):
        start = thread_time_ns()   # CPU time of this thread: waiting for the interpreter lock does not count
        try:
            return self.body(self.binding, self.inputs, block, self.nblocks)
        finally:
            self.history.note(thread_time_ns() - start)


class _OrderedRun:
    """PYPTO_DETERMINISTIC: `run`'s blocks keep their atomic adds; the task's last block to finish applies every
    block's, in block order (a failed block's too: the task fails all the same)."""
    __slots__ = ("run", "blocks", "host_ok", "parts", "left", "lock")

    def __init__(self, run: "_Run"):
        self.run, self.blocks, self.host_ok = run, run.blocks, run.host_ok
        self.parts: list = [None] * run.blocks
        self.left = run.blocks
        self.lock = threading.Lock()

    def __call__(self, block: int):
        parts: list = []
        try:
            with accumulate.collecting(parts):
                return self.run(block)
        finally:
            self.parts[block] = parts
            with self.lock:
                self.left -= 1
                last = self.left == 0
            if last:
                accumulate.apply(self.parts)
                self.parts = []


class _CommRun(_Run):
    """A communication task's block: its thread's wait label is the region's name while it runs."""
    __slots__ = ("label",)

    def __init__(self, binding, body, inputs, blocks, history, host_ok, label):
        super().__init__(binding, body, inputs, blocks, history, host_ok)
        self.label = label

    def __call__(self, block: int):
        previous = process.current_label()
        process.set_label(self.label)
        try:
            return _Run.__call__(self, block)
        finally:
            process.set_label(previous)


class BlockCall:
    """One block of a kernel as a plain call, `call(block, *inputs)`: what a run recorded for replay runs for a
    block it calls as it is, and its replay calls again (replay.opaque). It runs the kernel's own run function (not
    the traced variant the recorded run executes elsewhere), with the task's block count and a communication
    task's label set for wait reports (a timeout inside a replay gives the same report)."""
    __slots__ = ("fn", "nblocks", "label", "binding")

    def __init__(self, fn, nblocks: int, label: str | None, binding):
        self.fn, self.nblocks, self.label, self.binding = fn, nblocks, label, binding

    def __call__(self, block: int, *inputs):
        previous = process.current_label()
        process.set_label(self.label)
        try:
            return run_block(self.binding, self.fn, inputs, block, self.nblocks)
        finally:
            process.set_label(previous)

    def __repr__(self) -> str:
        return f"<block of {self.label!r} ({self.nblocks} blocks)>"


def _opaque_body(recorder, artifact, label: str | None):
    """A block body for a run recorded for replay that the recorder runs as one opaque `BlockCall` of the kernel's
    plain run function, writing down its inputs as code of the replay (a communication task's, `label` its name;
    or one whose course an earlier recording found to depend on data)."""
    plain = artifact.plain_variant() if artifact.plain_variant is not None else artifact

    def body(binding, inputs, block, nblocks):
        call = BlockCall(plain.kernel.run, nblocks, label, binding)
        try:
            return recorder.opaque_block(call, inputs, block, _written(artifact, inputs), label is not None)
        finally:
            # a replay has no binding of its own: In-parameter writes warned when recorded are warned again by
            # the entry's replay; dims are fixed by the specialisation
            call.binding = Binding(names=[], values=[])
    return body


def _written(artifact, inputs: tuple) -> list[int]:
    """Indices of the inputs a block writes (its Out/InOut accesses); all, when the plan cannot tell."""
    try:
        plan = artifact.accesses(*(untraced(v) for v in inputs))
    except Exception:  # noqa: BLE001 - a plan the host cannot evaluate: every input may be written
        return list(range(len(inputs)))
    return sorted({index for index, mode, _, _, _ in plan if mode != "r"})


def _signalling_body(recorder, artifact):
    """A communication task's kernel watched by the recorder, its `pld` ops recorded as calls of their effects
    (replay.comm_block). A refusal inside is noted on the kernel (`SIGNALS_REFUSED`): its blocks are called as they
    are by every later recording, of any specialisation (the next one of this specialisation: replay.entry)."""
    watched = _watched_body(recorder, artifact)

    def body(binding, inputs, block, nblocks):
        recorder.signalling, recorder.communicates = True, True
        try:
            return watched(binding, inputs, block, nblocks)
        finally:
            recorder.signalling = False
            if id(artifact) in recorder.escaped:
                artifact.__dict__.setdefault(SIGNALS_REFUSED, recorder.escaped[id(artifact)])
    return body


def _watched_body(recorder, artifact):
    """The kernel itself, with `recorder.block` naming it while a block runs (a refusal inside marks it)."""
    key, run = id(artifact), artifact.kernel.run

    def body(binding, inputs, block, nblocks):
        recorder.block = key
        try:
            return run_block(binding, run, inputs, block, nblocks)
        finally:
            recorder.block = None
    return body


class _CheckedRun:
    """All blocks, then the same region on the op library on copies, then a comparison of what it wrote."""
    __slots__ = ("runner", "artifact", "inputs", "nblocks", "accesses", "blocks", "label")

    def __init__(self, runner, artifact, inputs, nblocks, accesses):
        self.runner, self.artifact, self.inputs, self.nblocks, self.accesses = (
            runner, artifact, inputs, nblocks, accesses)
        self.blocks = 1
        self.label = None

    def __call__(self, _block: int):
        if self.label is None:
            return self._check()
        previous = process.current_label()
        process.set_label(self.label)
        try:
            return self._check()
        finally:
            process.set_label(previous)

    def _check(self):
        binding = self.runner.binding
        copies = tuple(TensorValue(v.data.clone(), v.dtype) if isinstance(v, TensorValue) else v
                       for v in self.inputs)
        result = None
        for b in range(self.nblocks):
            out = run_block(binding, self.artifact.kernel.run, self.inputs, b, self.nblocks)
            result = out if b == 0 else result
        reference = _reference_run(self.artifact)
        for b in range(self.nblocks):
            run_block(binding, reference, copies, b, self.nblocks)
        for access, box, index in self.accesses:
            if access.mode != "r":
                self._compare(index, box, self.inputs[index].data, copies[index].data)
        return result

    def _compare(self, index, box, got, want):
        if box is not None:
            window = tuple(slice(o, o + s) for o, s in zip(*box))
            got, want = got[window], want[window]
        if torch.equal(got, want):
            return
        tol = self.runner.tolerance
        g, w = got.double(), want.double()
        bad = ~((g - w).abs() <= tol + tol * w.abs()) & ~(g.isnan() & w.isnan())
        if not bad.any():
            return
        err = torch.where(bad, (g - w).abs().nan_to_num(float("inf")), torch.zeros_like(g))
        flat = int(err.flatten().argmax())
        where = list(torch.unravel_index(torch.tensor(flat), err.shape)) if err.dim() else []
        at = [int(i) + (box[0][d] if box else 0) for d, i in enumerate(where)]
        ir = self.artifact.ir
        raise CheckMismatchError(
            f"PYPTO_CHECK=reference: region '{ir.display}' wrote '{ir.params[index]}' differently from the op "
            f"library: {int(bad.sum())} element(s) off; worst at {at}: compiled {g.flatten()[flat].item()!r}, "
            f"reference {w.flatten()[flat].item()!r} (tolerance {tol:g})", ir.span,
            "this is the first region whose outputs differ; the regions before it agree")


def _reference_run(artifact):
    """The region compiled with every `pl` call dispatched through the executor (the op library, eagerly)."""
    fn = getattr(artifact, "reference_run", None)
    if fn is None:
        ir = artifact.ir
        if ir.anchor is None and artifact.traced_variant is not None:
            # loaded from the disk cache, which keeps the generated code and not the region's body: the traced variant
            # is compiled from the source (the same region, the same coalescing) and has it
            ir = artifact.traced_variant().ir
        fn = BACKENDS["torch"].compile(ir, ir.env.globals, direct_ops=False).run
        artifact.reference_run = fn
    return fn
