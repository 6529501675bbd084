"""The HostExecutor: runs a host program on the calling thread, submitting InCore kernels as tasks.

What runs on the host: loops (one task-ring scope per iteration, as the real runtime places a
scope per loop body), ifs, scalar code, views and `create_tensor` (no waiting: they touch no data),
and any op that reads or writes tensor data — which first waits for exactly the in-flight tasks
producing (or, for a write, also reading) that tensor. Kernels run on the engine's workers.
"""
from __future__ import annotations

import inspect
import math
import warnings

from pypto_rt import config
from pypto_rt.aicpu import Access as EngineAccess
from pypto_rt.aicpu import Task, region_of
from pypto_rt.errors import InWriteWarning, KernelArgumentError, NotSupportedError, user_span
from pypto_rt.incore_compiler.compiler import incore_kernel
from pypto_rt.language.enums import FunctionType, Level
from pypto_rt.language.scopes import Spmd
from pypto_rt.ops.registry import IN_PLACE_TARGETS
from pypto_rt.ops.value import TensorValue
from pypto_rt.orchestration.program import host_program
from pypto_rt.orchestration.task_runner import TaskRunner
from pypto_rt.reference.executor import ReferenceExecutor, warn_directions_on_inline

# host ops that only make views, shapes or bookkeeping: no tensor data is touched, nothing waits
_NO_WAIT = {"slice", "reshape", "reinterpret_view", "transpose_view", "dim", "set_validshape", "__getitem__",
            "create_tensor", "create", "full", "create_tile", "arange", "array.create", "no_dep", "dump_tag",
            "func_attr", "static_print", "static_assert", "prefetch.make_context", "prefetch.async_prefetch",
            "system.fence", "system.cacheinvalid", "ci", "tri", "expands"}
_INCORE_TYPES = (FunctionType.InCore, FunctionType.AIC, FunctionType.AIV, FunctionType.Group, FunctionType.Spmd)


def _base(name: str) -> str:
    return name.split(".", 1)[1] if name.startswith(("tensor.", "tile.")) else name


class HostExecutor(ReferenceExecutor):
    """Orchestration of one entry call on an engine."""

    INTRINSICS = {**ReferenceExecutor.INTRINSICS, "submit": "_submit_call", "spmd_submit": "_spmd_submit_call",
                  "system.task_dummy": "_task_dummy"}

    def __init__(self, binding, engine):
        super().__init__(binding)
        self.engine = engine
        self.manual_depth = 0
        self.open_scopes: list = []
        self.runner = TaskRunner(binding, check=config.CHECK.get() == "reference")

    # -- entry -----------------------------------------------------------------------------------
    def run_entry(self, kernel):
        if is_incore(kernel):
            return self.call_kernel(kernel, tuple(self.binding.values), {})
        return host_program(kernel).run(*self.binding.values)

    def call_kernel(self, kernel, args, kwargs):
        if kernel.kind == "extern" or "device" in kwargs:
            return super().call_kernel(kernel, args, kwargs)   # says why it cannot run
        if is_incore(kernel):
            task = self._submit_function(kernel, args, kwargs, deps=None, blocks=1, name=None)
            return self.results(task)
        if kernel.kind == "inline" and "inline_warned" not in kernel.cache:
            kernel.cache["inline_warned"] = True
            warn_directions_on_inline(kernel)
        return host_program(kernel).run(*args, **kwargs)

    # -- region tasks (called by generated host code) --------------------------------------------
    def submit(self, artifact, inputs, name_hint=None, deps=None, core_num=None, no_dep_args=None):
        blocks = 1 if core_num is None else int(core_num)
        accesses = self._accesses(artifact, inputs, no_dep_args)
        run = self.runner.runner(artifact, inputs, blocks, accesses)
        return self.engine.submit(name_hint or artifact.ir.display, run, [a for a, _, _ in accesses],
                                  deps=_flatten(deps), blocks=run.blocks, span=artifact.ir.span,
                                  manual=self.manual_depth > 0)

    def chunks(self, start, stop, step, independent, artifact, others):
        """(offset, extent) per task of a coalesced loop: one chunk per worker, or one per iteration when the
        iterations of a sequential loop could see each other's writes (an input aliases an output)."""
        start, stop, step = int(start), int(stop), int(step)
        n = len(range(start, stop, step))
        if step <= 0 or n == 0 or (not independent and _may_alias(artifact, others)):
            return [(v, step) for v in range(start, stop, step)]
        written = _written_bytes(artifact, others, start, n * step)
        count = min(n, self.engine.num_workers, max(1, written // _MIN_CHUNK_BYTES))
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
        artifact = incore_kernel(kernel)
        try:
            bound = inspect.signature(kernel.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise KernelArgumentError(f"{kernel.name}: {e}", user_span()) from None
        bound.apply_defaults()
        inputs = tuple(bound.arguments[p] for p in artifact.ir.params)
        accesses = self._accesses(artifact, inputs, None)
        run = self.runner.runner(artifact, inputs, blocks, accesses)
        return self.engine.submit(name or artifact.ir.display, run, [a for a, _, _ in accesses],
                                  deps=_flatten(deps), blocks=run.blocks, span=user_span() or artifact.ir.span,
                                  manual=self.manual_depth > 0)

    def _submit_call(self, kernel, *args, deps=None, **kwargs):
        task = self._submit_function(kernel, args, kwargs, deps, 1, None)
        return self.results(task), task

    def _spmd_submit_call(self, kernel, *args, core_num=1, deps=None, **kwargs):
        task = self._submit_function(kernel, args, kwargs, deps, int(core_num), None)
        return self.results(task), task

    def _task_dummy(self, *, deps=None):
        return self.engine.dummy(_flatten(deps), span=user_span())

    def _accesses(self, artifact, inputs, no_dep_args):
        """[(engine access, box, input index)] of the tensor inputs: exact boxes where the plan has them, else whole."""
        skip = set(no_dep_args or ())
        try:
            plan = artifact.accesses(*inputs)
        except Exception:  # noqa: BLE001 - a plan expression the host cannot evaluate: be conservative
            plan = tuple((i, "rw", None, None, 0) for i in range(len(inputs)))
        out = []
        for index, mode, offsets, sizes, line in plan:
            value = inputs[index]
            if not isinstance(value, TensorValue) or artifact.ir.params[index] in skip:
                continue
            region = region_of(value.data, offsets, sizes)
            box = _box(value.data.shape, offsets, sizes) if self.runner.check else None   # for its comparison
            out.append((EngineAccess(region, mode), box, index))
            if mode != "r" and line:   # a definite write (assumed ones, e.g. by a helper call, do not warn)
                self._warn_in_write(value, artifact, line)
        return out

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
        if name == "__getitem__" and _reads_one_element(args):   # `x[i, j]` on the host reads data
            self._wait_element(args[0], args[1] if isinstance(args[1], tuple) else (args[1],))
        elif name not in self.INTRINSICS and _base(name) not in _NO_WAIT:
            self._wait_operands(name, args, kwargs)
        return super().call_op(name, args, kwargs)

    def _wait_element(self, tensor, index):
        self.engine.wait_region(region_of(tensor.data, index, [1] * len(index)))

    def _wait_operands(self, name, args, kwargs):
        writes = name in IN_PLACE_TARGETS
        if _base(name) == "read" and args and isinstance(args[0], TensorValue) and len(args) > 1:
            self._wait_element(args[0], args[1])
            return
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, TensorValue):
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
        for item in iterations:
            with self.engine.scope("loop body", span, manual=self.manual_depth > 0):
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


def _reads_one_element(args) -> bool:
    """`x[i, j]` with an integer for every axis of a tensor: a data read, not a view."""
    if len(args) != 2 or not isinstance(args[0], TensorValue):
        return False
    key = args[1] if isinstance(args[1], tuple) else (args[1],)
    return len(key) == args[0].data.dim() and all(isinstance(k, int) for k in key)


def is_incore(kernel) -> bool:
    return kernel.kind == "incore" or (kernel.kind == "function" and kernel.options.get("type") in _INCORE_TYPES)


# a coalesced chunk writes at least this much: smaller ones cost more in thread hand-offs than they gain
_MIN_CHUNK_BYTES = 256 * 1024


def _written_bytes(artifact, others, offset, extent) -> int:
    """Bytes the whole coalesced loop writes: the write boxes of one task spanning all of it."""
    c = artifact.ir
    value = dict(_inputs_by_name(artifact, others), **{c.coalesce_var: offset, "__extent": extent})
    try:
        plan = artifact.accesses(*(value[p] for p in c.params))
    except Exception:  # noqa: BLE001 - a plan the host cannot evaluate: count whole tensors
        plan = [(i, "w", None, None, 0) for i in range(len(c.params))]
    total = 0
    for index, mode, offsets, sizes, _ in plan:
        tensor = value.get(c.params[index])
        if mode == "r" or not isinstance(tensor, TensorValue):
            continue
        total += math.prod(region_of(tensor.data, offsets, sizes).shape) * tensor.data.element_size()
    return total


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
