"""The HostExecutor: runs a host program on the calling thread, submitting InCore kernels as tasks.

What runs on the host: loops (one task-ring scope per iteration, as the real runtime places a
scope per loop body), ifs, scalar code, views and `create_tensor` (no waiting: they touch no data),
and any op that reads or writes tensor data — which first waits for exactly the in-flight tasks
producing (or, for a write, also reading) that tensor. Kernels run on the engine's workers.

Communication is ordered by program order, not by the tensor map (runtime_model §4.5: a wait-only task
scheduled ahead of the same rank's send deadlocks a one-worker rank). A *communication task* is one whose
kernel calls a `pld.*` op (see `communicates`) or that gets a window tensor (a view of a
`pld.alloc_window_buffer`) as an input. Each communication task gets an explicit dependency on the previous
one this executor submitted (one comm domain: the whole job), so a rank's communication tasks form a chain in
program order — across nested and inline calls and inside manual scopes too (explicit deps hold there).
Window tensors make no tensor-map accesses: peers write them behind the engine's back, and ordering on them
comes from the chain. A host op touching a window (or a `pld.*` op run on the host) first waits for the chain.
"""
from __future__ import annotations

import inspect
import math
import types
import warnings

from pypto_rt import config
from pypto_rt.aicpu import Task, TaskAccess, region_of
from pypto_rt.collective import process
from pypto_rt.errors import InWriteWarning, KernelArgumentError, NotSupportedError, PyptoError, user_span
from pypto_rt.executor_base import ExecutorBase, is_incore, refuse_unrunnable, warn_directions_on_inline
from pypto_rt.incore_compiler.chunks import chunk_cap, chunk_count
from pypto_rt.incore_compiler.compiler import incore_kernel
from pypto_rt.incore_compiler.kernel_executor import refuse_replay_of_plain_python
from pypto_rt.language import distributed as pld
from pypto_rt.language.decorators import KernelFunction
from pypto_rt.language.enums import Level
from pypto_rt.language.ops import Namespace, OpStub
from pypto_rt.language.scopes import Spmd
from pypto_rt.ops import OPS, recording
from pypto_rt.ops.opdef import names_where
from pypto_rt.ops.registry import IN_PLACE_TARGETS
from pypto_rt.ops.value import TensorValue
from pypto_rt.orchestration.atomic_order import AtomicOrder
from pypto_rt.orchestration.program import host_program
from pypto_rt.orchestration.task_runner import TaskRunner
from pypto_rt.replay.scalars import untraced

# host ops that only make views, shapes or bookkeeping: no tensor data is touched, nothing waits
_NO_WAIT = names_where(lambda d: not d.waits_on_host)
_READS = names_where(lambda d: d.reads_data)
_READ = OPS["read"]


class HostExecutor(ExecutorBase):
    """Orchestration of one entry call on an engine."""

    INTRINSICS = {**ExecutorBase.INTRINSICS, "submit": "_submit_call", "spmd_submit": "_spmd_submit_call",
                  "system.task_dummy": "_task_dummy"}

    def __init__(self, binding, engine):
        super().__init__(binding)
        self.engine = engine
        self.manual_depth = 0
        self.open_scopes: list = []
        self.runner = TaskRunner(binding, check=config.CHECK.get() == "reference")
        self.last_comm: Task | None = None   # the communication task submitted last: the next one depends on it
        self.at_once: dict = {}   # id(artifact) -> how its tasks run at once (TaskRunner.at_once), or False: never
        self.write_checked: dict = {}   # id(value) -> TensorValue whose writes `_checks_only` has checked
        self.atomic_order = AtomicOrder() if config.DETERMINISTIC.get() == "1" else None   # (see `_atomic_adds`)

    # -- entry -----------------------------------------------------------------------------------
    def run_entry(self, kernel):
        refuse_replay_of_plain_python(kernel)
        if is_incore(kernel):
            return self.call_kernel(kernel, tuple(self.binding.values), {})
        return host_program(kernel, traced=recording.recording()).run(*self.binding.values)

    def call_kernel(self, kernel, args, kwargs):
        refuse_replay_of_plain_python(kernel)
        refuse_unrunnable(kernel, kwargs)
        if is_incore(kernel):
            task = self._submit_function(kernel, args, kwargs, deps=None, blocks=1, name=None)
            return self.results(task)
        if kernel.kind == "inline" and not kernel.state.inline_warned:
            kernel.state.inline_warned = True
            warn_directions_on_inline(kernel)
        return host_program(kernel, traced=recording.recording()).run(*args, **kwargs)

    # -- region tasks (called by generated host code) --------------------------------------------
    def submit(self, artifact, inputs, name_hint=None, deps=None, core_num=None, no_dep_args=None):
        blocks = 1 if core_num is None else int(core_num)
        return self._task(artifact, inputs, blocks, no_dep_args, name_hint or artifact.ir.display, deps,
                          artifact.ir.span)

    def _task(self, artifact, inputs, blocks, no_dep_args, name, deps, span):
        """Submit one kernel; a communication task also depends on the previous one (program order)."""
        now = self.at_once.get(id(artifact))
        if now is None:   # (artifacts outlive the run: their ids stay theirs)
            now = self.at_once[id(artifact)] = (not communicates(artifact) and self.runner.at_once(artifact)) or False
        if now and self.engine.runs_at_once(now) and not self._checks_only(artifact, inputs, no_dep_args):
            # nothing in flight: its producers (and `deps`) have all finished, so it needs no accesses
            task = self.engine.run_now(name, now.blocks(inputs, blocks), blocks, span=span)
            if task is not None:
                now.ran(task)
                return task
        accesses, windows = self._accesses(artifact, inputs, no_dep_args)
        deps = _flatten(deps)
        comm = windows or communicates(artifact)
        if comm:
            if self.last_comm is not None:
                deps.append(self.last_comm)
            else:   # the run's first communication task
                self._comm_waits_report_first()
        run = self.runner.runner(artifact, inputs, blocks, accesses, label=name if comm else None,
                                 signals=communicates(artifact))
        adds = self._atomic_adds(artifact, inputs) if self.atomic_order is not None and artifact.atomic_entries else ()
        task = self.engine.submit(name, run, [a for a, _, _ in accesses], deps=deps, blocks=run.blocks, span=span,
                                  manual=self.manual_depth > 0, order=self.atomic_order.follow(adds) if adds else ())
        if adds:
            self.atomic_order.note(task, adds)
        if comm:
            self.last_comm = task
        return task

    def _atomic_adds(self, artifact, inputs) -> list:
        """PYPTO_DETERMINISTIC: the regions a task adds into atomically; it follows the earlier tasks adding into
        them (orchestration.atomic_order), in manual scopes and past `no_dep` too."""
        try:
            plan = artifact.accesses(*inputs)
            entries = [plan[i] for i in artifact.atomic_entries]
        except Exception:  # noqa: BLE001 - a plan the host cannot evaluate: every tensor input, whole
            entries = [(i, "rw", None, None, 0) for i in range(len(inputs))]
        out = []
        for index, _, offsets, sizes, _ in entries:
            value = inputs[index]
            if isinstance(value, TensorValue) and process.window_of(value.data) is None:   # windows: the comm chain
                out.append(region_of(value.data, offsets, sizes))
        return out

    def _comm_waits_report_first(self):
        """A run that communicates: its engine's no-progress watchdog (PYPTO_TIMEOUT_S since the last task
        started or finished) waits a little longer than a comm wait's own deadline (PYPTO_TIMEOUT_S since the wait
        began), so a wait nobody satisfies ends with the wait's report (rank, region, cell, values seen and
        expected), which the launcher merges across ranks, rather than with the engine's task list."""
        waits = config.get_float(config.TIMEOUT_S)
        self.engine.timeout_s = max(self.engine.timeout_s, waits + max(1.0, 0.1 * waits))

    def chunks(self, start, stop, step, independent, artifact, others):
        """(offset, extent) per task of a coalesced loop: one chunk per worker, or one per iteration when the
        iterations of a sequential loop could see each other's writes (an input aliases an output)."""
        start, stop, step = int(start), int(stop), int(step)
        n = len(range(start, stop, step))
        if step <= 0 or n == 0 or (not independent and _may_alias(artifact, others)) or _spans(artifact, others):
            return [(v, step) for v in range(start, stop, step)]
        written, touched = _tile_bytes(artifact, others, start, n * step)
        cap = chunk_cap()
        per_iteration = 0
        if cap and touched > cap and n > 1:   # what one more iteration adds to a task (whole-tensor reads do not)
            per_iteration = max(1, (touched - _tile_bytes(artifact, others, start, step)[1]) // (n - 1))
        count = chunk_count(n, self.engine.num_workers, written, per_iteration, cap)
        base, extra = divmod(n, count)
        out, first = [], 0
        for c in range(count):
            size = base + (c < extra)
            out.append((start + first * step, size * step))
            first += size
        return out

    def results(self, task):
        """A task's results, once it is done (the host reads values the region computed)."""
        self.engine.wait([task])
        return task.result

    def _submit_function(self, kernel, args, kwargs, deps, blocks, name):
        artifact = incore_kernel(kernel, traced=recording.recording())
        try:
            bound = inspect.signature(kernel.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise KernelArgumentError(f"{kernel.name}: {e}", user_span()) from None
        bound.apply_defaults()
        inputs = tuple(bound.arguments[p] for p in artifact.ir.params)
        return self._task(artifact, inputs, blocks, None, name or artifact.ir.display, deps,
                          user_span() or artifact.ir.span)

    def _submit_call(self, kernel, *args, deps=None, **kwargs):
        task = self._submit_function(kernel, args, kwargs, deps, 1, None)
        return self.results(task), task

    def _spmd_submit_call(self, kernel, *args, core_num=1, deps=None, **kwargs):
        task = self._submit_function(kernel, args, kwargs, deps, int(core_num), None)
        return self.results(task), task

    def _task_dummy(self, *, deps=None):
        return self.engine.dummy(_flatten(deps), span=user_span())

    def _accesses(self, artifact, inputs, no_dep_args):
        """([(engine access, box, input index)] of the tensor inputs: exact boxes where the plan has them, else
        whole; whether an input is a window tensor (those make no accesses: the comm chain orders them))."""
        skip = set(no_dep_args or ())
        if self.runner.recorder is not None:   # a recorded run: boxes only order its tasks, no guard on their numbers
            inputs = tuple(untraced(v) for v in inputs)
        try:
            plan = artifact.accesses(*inputs)
        except Exception:  # noqa: BLE001 - a plan expression the host cannot evaluate: be conservative
            plan = tuple((i, "rw", None, None, 0) for i in range(len(inputs)))
        out = []
        windows = False
        for index, mode, offsets, sizes, line in plan:
            value = inputs[index]
            if not isinstance(value, TensorValue):
                continue
            if process.window_of(value.data) is not None:   # None at once in a process without windows
                windows = True
                continue
            if artifact.ir.params[index] in skip:
                continue
            region = region_of(value.data, offsets, sizes)
            box = _box(value.data.shape, offsets, sizes) if self.runner.check else None   # for its comparison
            out.append((TaskAccess(region, mode), box, index))
            if mode != "r" and line:   # a definite write (assumed ones, e.g. by a helper call, do not warn)
                self._warn_in_write(value, artifact, line)
        return out, windows

    def _checks_only(self, artifact, inputs, no_dep_args) -> bool:
        """What `_accesses` checks, for a task that runs at once (`Engine.runs_at_once`; the kernel's static
        accesses suffice): warn of definite writes into In parameters; whether an input is a window tensor."""
        if not self.binding.readonly and not process.has_windows():
            return False
        plan = artifact.__dict__.get("checks_plan")
        if plan is None:   # (index, param, line) of each definite write; indices of every access
            index_of = {p: i for i, p in enumerate(artifact.ir.params)}
            plan = artifact.checks_plan = (
                tuple((index_of[a.param], a.param, a.line) for a in artifact.ir.accesses if a.mode != "r" and a.line),
                tuple(index_of[a.param] for a in artifact.ir.accesses))
        windows = process.has_windows() and any(
            type(inputs[i]) is TensorValue and process.window_of(inputs[i].data) is not None for i in plan[1])
        if self.binding.readonly:   # only an entry with In tensors can be written into by mistake
            checked = self.write_checked
            for index, param, line in plan[0]:
                value = inputs[index]
                if checked.get(id(value)) is not value and type(value) is TensorValue and param not in (
                        no_dep_args or ()) and (not windows or process.window_of(value.data) is None):
                    self._warn_in_write(value, artifact, line)
                    checked[id(value)] = value   # (it warns once per In parameter: checking it again does nothing)
        return windows

    def _warn_in_write(self, value, artifact, line):
        param = self.binding.readonly.get(value.data.untyped_storage().data_ptr()) if self.binding.readonly else None
        if param is None or param in self.binding.warned_writes:
            return
        self.binding.warned_writes.add(param)
        warnings.warn_explicit(
            f"kernel '{artifact.ir.display}' writes into '{param}', an In parameter of the entry; on the device the "
            f"caller does not see this write (annotate '{param}' as pl.Out[...] or pl.InOut[...] if it is a result)",
            InWriteWarning, artifact.ir.file, line)

    # -- host ops --------------------------------------------------------------------------------
    def call_op(self, name, args, kwargs):
        if name in _READS or (name == "__getitem__" and _reads_one_element(args)):
            self.engine.host_reads += 1
        if name in _READS and not kwargs and len(args) == 2 and type(args[0]) is TensorValue and self.engine.idle():
            # `pl.read(t, [i])` with nothing in flight (a host loop over an index tensor): no wait, no dispatch
            try:
                return _READ(*args)
            except PyptoError as e:
                raise e.at(user_span()) from None
        if name == "__getitem__" and _reads_one_element(args):   # `x[i, j]` on the host reads data
            self._wait_element(args[0], args[1] if isinstance(args[1], tuple) else (args[1],))
        elif name not in self.INTRINSICS and name not in _NO_WAIT:
            self._wait_operands(name, args, kwargs)
        return super().call_op(name, args, kwargs)

    def _wait_element(self, tensor, index):
        if self.engine.idle():   # nothing in flight: nothing to wait for
            return
        if self.last_comm is not None and process.window_of(tensor.data) is not None:
            self.engine.wait([self.last_comm])   # windows are not in the tensor map: wait for the comm chain
            return
        self.engine.wait_region(region_of(tensor.data, index, [1] * len(index)))

    def _wait_operands(self, name, args, kwargs):
        if self.engine.idle():   # nothing in flight: nothing to wait for
            return
        writes = name in IN_PLACE_TARGETS
        if self.last_comm is not None and name.startswith("pld."):
            self.engine.wait([self.last_comm])   # communication on the host comes after the chain, in program order
        if name in _READS and args and isinstance(args[0], TensorValue) and len(args) > 1:
            self._wait_element(args[0], args[1])
            return
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, TensorValue):
                if self.last_comm is not None and process.window_of(value.data) is not None:
                    self.engine.wait([self.last_comm])
                else:
                    self.engine.wait_region(region_of(value.data), for_write=writes)

    # -- loops and scopes ------------------------------------------------------------------------
    def iterate(self, loop):
        if isinstance(loop, Spmd) or loop.kind == "split_aiv":
            raise NotSupportedError(f"pl.{'spmd' if isinstance(loop, Spmd) else loop.kind} here is not outlined "
                                    "into a kernel (it is not directly in a kernel function's body)", loop.span,
                                    "write the loop in the @pl.jit function itself, or run with "
                                    "PYPTO_EXECUTOR=reference")
        return self._scoped(super().iterate(loop), loop.span)

    def _scoped(self, iterations, span):
        scope = self.engine.scope("loop body", span, manual=self.manual_depth > 0)
        for item in iterations:
            with scope:
                yield item

    def enter_scope(self, scope):
        if scope.kind == "at" and scope.level in (None, Level.CORE_GROUP):
            raise NotSupportedError("this pl.at region is not outlined into a kernel (it is not directly in a "
                                    "kernel function's body)", scope.span,
                                    "move it into the @pl.jit function itself, or run with PYPTO_EXECUTOR=reference")
        if scope.kind in ("scope", "manual_scope"):
            manual = scope.kind == "manual_scope"
            self.manual_depth += manual
            cm = self.engine.scope(scope.kind, scope.span, manual=manual or self.manual_depth > 0)
            cm.__enter__()
            self.open_scopes.append((cm, manual))
        return super().enter_scope(scope)

    def exit_scope(self, scope, failed):
        if scope.kind in ("scope", "manual_scope") and self.open_scopes:
            cm, manual = self.open_scopes.pop()
            self.manual_depth -= manual
            cm.__exit__(None, None, None)


def communicates(artifact) -> bool:
    """Whether a kernel communicates (decided once per artifact): it calls a `pld.*` op directly (its injected
    ops), or its generated code refers to a `pld` op, namespace or module it did not turn into a direct call, or
    to a helper kernel (`@pl.jit.inline` / `.incore`) that communicates by the same test. A helper that cannot be
    compiled counts as communicating (unknown: the chain only adds an ordering edge). Not seen: plain Python
    functions (no `@pl.jit...`) that call `pld` ops."""
    known = artifact.__dict__.get("communicates")
    if known is None:
        known = artifact.communicates = _communicates(artifact, set())
    return known


def _communicates(artifact, seen: set) -> bool:
    if any(q.startswith("pld.") for q in artifact.kernel.ops.values()):
        return True
    run = artifact.kernel.run
    code = getattr(run, "__code__", None)
    if code is None:
        return False
    cells = {name: c.cell_contents for name, c in zip(code.co_freevars, run.__closure__ or ()) if _bound(c)}
    module_globals = getattr(run, "__globals__", {})
    for name in _names(code):
        value = cells[name] if name in cells else module_globals.get(name)
        if value is None:
            continue
        if _is_pld(value):
            return True
        if isinstance(value, KernelFunction) and value.kind != "extern" and id(value) not in seen:
            seen.add(id(value))
            try:
                helper = incore_kernel(value)
            except Exception:  # noqa: BLE001 - it fails again where it runs; here: unknown, so conservative
                return True
            if helper.__dict__.get("communicates") or _communicates(helper, seen):
                return True
    return False


def _bound(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _names(code: types.CodeType):
    """Global and free names a function's code (and the code nested in it) refers to."""
    yield from code.co_names
    yield from code.co_freevars
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _is_pld(value) -> bool:
    if isinstance(value, OpStub):
        return value.qualname.startswith("pld.")
    if isinstance(value, Namespace):
        return value._name.startswith("pld")
    return isinstance(value, types.ModuleType) and getattr(value, "system", None) is pld.system


def _reads_one_element(args) -> bool:
    """`x[i, j]` with an integer for every axis of a tensor: a data read, not a view."""
    if len(args) != 2 or not isinstance(args[0], TensorValue):
        return False
    key = args[1] if isinstance(args[1], tuple) else (args[1],)
    return len(key) == args[0].data.dim() and all(isinstance(k, int) for k in key)


def _tile_bytes(artifact, others, offset, extent) -> tuple[int, int]:
    """(bytes written, bytes read or written) by one task of the coalesced loop spanning `extent` from `offset`:
    the boxes of its access plan."""
    c = artifact.ir
    value = dict(_inputs_by_name(artifact, others), **{c.coalesce_var: offset, "__extent": extent})
    try:
        plan = artifact.accesses(*(value[p] for p in c.params))
    except Exception:  # noqa: BLE001 - a plan the host cannot evaluate: count whole tensors
        plan = [(i, "w", None, None, 0) for i in range(len(c.params))]
    written = touched = 0
    for index, mode, offsets, sizes, _ in plan:
        tensor = value.get(c.params[index])
        if not isinstance(tensor, TensorValue):
            continue
        size = math.prod(region_of(tensor.data, offsets, sizes).shape) * tensor.data.element_size()
        touched += size
        written += size if mode != "r" else 0
    return written, touched


def _spans(artifact, others) -> bool:
    """Whether an input the coalesced kernel broadcasts against its tiles spans the tiled dimension (extent > 1):
    merged tiles would meet it at another extent, so each iteration runs as written."""
    c = artifact.ir
    if not c.coalesce_untiled:
        return False
    value = _inputs_by_name(artifact, others)
    for name in c.coalesce_untiled:
        v = value.get(name)
        if isinstance(v, TensorValue) and (v.ndim != 2 or v.shape[c.coalesce_dim] != 1):
            return True
    return False


def _may_alias(artifact, others) -> bool:
    """Whether a tensor the kernel writes shares storage with one it reads (`others`: inputs minus the loop
    variable and the extent, in parameter order)."""
    c = artifact.ir
    value = _inputs_by_name(artifact, others)
    written = {a.param for a in c.accesses if a.mode != "r"}
    storages = {}
    for a in c.accesses:
        v = value.get(a.param)
        if isinstance(v, TensorValue):
            storages.setdefault(v.data.untyped_storage().data_ptr(), set()).add(a.param in written)
    return any(len(kinds) > 1 for kinds in storages.values()) or bool(written & {a.param for a in c.accesses
                                                                                 if a.mode == "r"})


def _inputs_by_name(artifact, others) -> dict:
    """A coalesced kernel's inputs by name, from `others` (all of them but the offset and the extent)."""
    c = artifact.ir
    return dict(zip([p for p in c.params if p != c.coalesce_var and p != "__extent"], others))


def _box(shape, offsets, sizes):
    """Per-dim (offsets, sizes) of an access (for PYPTO_CHECK's comparison); None entries mean 0 / to the end.
    None if the access is the whole tensor."""
    if offsets is None:
        return None
    offs, lens = [], []
    for d, extent in enumerate(shape):
        o = offsets[d] if d < len(offsets) else None
        s = sizes[d] if sizes is not None and d < len(sizes) else None
        o = 0 if o is None else int(o)
        lens.append(extent - o if s is None else int(s))
        offs.append(o)
    return offs, lens


def _flatten(deps) -> list:
    if deps is None:
        return []
    out = []
    for d in deps if isinstance(deps, (list, tuple)) else [deps]:
        if isinstance(d, (list, tuple)):
            out.extend(_flatten(d))
        elif isinstance(d, Task):
            out.append(d)
    return out
