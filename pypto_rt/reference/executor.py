"""The reference executor: runs a kernel's Python body eagerly, in program order, on the op library.

It is the semantic oracle every other executor is checked against (like Triton's interpreter).
Loops iterate in order, `pl.parallel` iterations and spmd blocks run one after another, and
scheduling hints (`deps=`, scopes, task_dummy, prefetch) are genuine no-ops: sequential program
order is a legal schedule of every task graph. Before a kernel function first runs in a context
(host or InCore code) it passes the front end's placement checks, as it does when compiled: the
same errors, and the same style warnings once per function.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

from pypto_rt.errors import (
    DSLError, InWriteWarning, NotSupportedError, OpError, PyptoError, UnknownOpError, user_span,
)
from pypto_rt.frontend.analyze import placement_notes
from pypto_rt.frontend.notes import warn_once
from pypto_rt.language.enums import FunctionType, Level, SplitMode
from pypto_rt.language.scopes import Loop, Spmd
from pypto_rt.language.types import TensorType
from pypto_rt.ops import OPS
from pypto_rt.ops.registry import IN_PLACE_TARGETS
from pypto_rt.ops.system import TaskToken
from pypto_rt.ops.value import TensorValue
from pypto_rt.reference.rewrite import rewrite_spmd_with

_SIGNATURES: dict[str, inspect.Signature] = {}
_TORCH_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


@dataclass
class _Carried:
    values: tuple


class ReferenceExecutor:
    """Eager, single-threaded execution of one entry call."""

    # intrinsics: op names answered from executor state -> the method answering them (looked up per call, so
    # subclasses can add theirs and constructing an executor stays cheap: one is made per task block)
    INTRINSICS = {
        "get_block_idx": "_block_idx", "tile.get_block_idx": "_block_idx", "tensor.get_block_idx": "_block_idx",
        "get_block_num": "_block_num", "tile.get_block_num": "_block_num", "tensor.get_block_num": "_block_num",
        "get_subblock_idx": "_subblock_idx", "tile.get_subblock_idx": "_subblock_idx",
        "submit": "_submit", "spmd_submit": "_spmd_submit", "system.syncall": "_syncall",
    }

    def __init__(self, binding):
        self.binding = binding
        self.block_idx = 0
        self.block_num = 1
        self.subblock_idx = 0
        self.carried: list[_Carried] = []
        self.incore_depth = 0   # > 0 while running InCore code (a pl.at or pl.spmd body, an InCore function)

    # -- entry -----------------------------------------------------------------------------------
    def run_entry(self, kernel):
        return self.call_kernel(kernel, tuple(self.binding.values), {})

    def call_kernel(self, kernel, args, kwargs):
        if kernel.kind == "extern":
            raise NotSupportedError(f"not supported yet: @pl.jit.extern kernel {kernel.name} (hand-written device "
                                    "C++ cannot run on the CPU)", user_span())
        if "device" in kwargs:
            raise NotSupportedError(f"not supported yet: dispatching {kernel.name} with device= (multi-rank host "
                                    "programs come with the multi-rank runtime)", user_span())
        incore = is_incore(kernel)
        context = "incore" if incore or self.incore_depth else "host"
        state = kernel.state
        if context not in state.reference_checked:   # placement depends on where the function runs
            warn_once(kernel, placement_notes(kernel, context))
            state.reference_checked.add(context)
        fn = state.reference
        if fn is None:
            if kernel.kind == "inline":
                warn_directions_on_inline(kernel)
            fn = rewrite_spmd_with(kernel.fn) or kernel.fn
            state.reference = fn
        self.incore_depth += incore
        try:
            return fn(*args, **kwargs)
        finally:
            self.incore_depth -= incore

    # -- ops -------------------------------------------------------------------------------------
    def call_op(self, name, args, kwargs):
        method = self.INTRINSICS.get(name)
        impl = getattr(self, method) if method else OPS.get(name)
        if impl is None:
            raise UnknownOpError(f"unknown op pl.{name}", user_span())
        target = IN_PLACE_TARGETS.get(name)
        if target is not None and self.binding.readonly:
            self._check_writable(name, _written_argument(name, impl, target, args, kwargs))
        try:
            return impl(*args, **kwargs)
        except PyptoError as e:
            raise e.at(user_span()) from None
        except _TORCH_ERRORS as e:
            self._bind(name, impl, args, kwargs)  # a signature mismatch is reported as such
            raise OpError(f"pl.{name} failed on ({_describe(args)}): {e}", user_span()) from e

    @staticmethod
    def _bind(name, impl, args, kwargs) -> inspect.BoundArguments:
        sig = _SIGNATURES.get(name)
        if sig is None:
            sig = _SIGNATURES[name] = inspect.signature(impl)
        try:
            return sig.bind(*args, **kwargs)
        except TypeError as e:
            raise OpError(f"pl.{name}: {e}", user_span(), f"the signature is pl.{name}{sig}") from None

    def _check_writable(self, name, target):
        """Writes into an In parameter warn once per parameter: real kernels use In tensors as device scratch,
        but the caller never sees those writes on the device (the harness rejects compared In outputs)."""
        if not isinstance(target, TensorValue) or not self.binding.readonly:
            return
        param = self.binding.readonly.get(target.data.untyped_storage().data_ptr())
        if param is None or param in self.binding.warned_writes:
            return
        self.binding.warned_writes.add(param)
        span = user_span()
        what = "subscript assignment" if name == "__setitem__" else f"pl.{name}"
        warnings.warn_explicit(
            f"{what} writes into '{param}', an In parameter of the kernel; on the device the caller does not see "
            f"this write (annotate '{param}' as pl.Out[...] or pl.InOut[...] if it is a result)",
            InWriteWarning, span.file if span else "<kernel>", span.line if span else 0)

    # -- loops and scopes ------------------------------------------------------------------------
    def iterate(self, loop):
        if isinstance(loop, Spmd):
            return self._spmd_blocks(loop)
        if loop.kind == "split_aiv":
            return self._aiv_lanes(loop)
        try:
            bounds = range(int(loop.start), int(loop.stop), int(loop.step))
        except (TypeError, ValueError):
            raise DSLError(f"pl.{loop.kind} bounds must be integers, got ({loop.start!r}, {loop.stop!r}, "
                           f"{loop.step!r})", loop.span) from None
        if loop.init_values is None:
            return iter(bounds)
        return self._carried_loop(bounds, loop.init_values)

    def _carried_loop(self, bounds, init_values):
        state = _Carried(tuple(init_values))
        self.carried.append(state)
        try:
            for i in bounds:
                yield i, state.values
        finally:
            self.carried.remove(state)

    def _spmd_blocks(self, dispatch: Spmd):
        n = int(dispatch.core_num)
        saved = self.block_idx, self.block_num
        self.incore_depth += 1
        try:
            for b in range(n):
                self.block_idx, self.block_num = b, n
                yield b
        finally:
            self.block_idx, self.block_num = saved
            self.incore_depth -= 1

    def _aiv_lanes(self, loop: Loop):
        lanes = range(int(loop.stop)) if loop.mode in (None, SplitMode.NONE) else range(1)
        saved = self.subblock_idx
        try:
            for lane in lanes:
                self.subblock_idx = lane
                yield lane
        finally:
            self.subblock_idx = saved

    def yield_(self, values):
        if self.carried:
            self.carried[-1].values = tuple(values)
        return values[0] if len(values) == 1 else tuple(values)

    def enter_scope(self, scope):
        self.incore_depth += _opens_incore(scope)
        return TaskToken(getattr(scope, "name_hint", "") or "")

    def exit_scope(self, scope, failed):
        self.incore_depth -= _opens_incore(scope)

    def bind_dynamic(self, value, dim, var):
        extent = value.shape[int(dim)]
        seen = self.binding.dyn.setdefault(var, extent)
        if seen != extent:
            raise DSLError(f"bind_dynamic: axis {dim} is {extent} but {getattr(var, 'name', var)} is already {seen}",
                           user_span())

    # -- intrinsics: executor state --------------------------------------------------------------
    def _block_idx(self):
        return self.block_idx

    def _block_num(self):
        return self.block_num

    def _subblock_idx(self):
        return self.subblock_idx

    def _submit(self, kernel, *args, deps=None, **kwargs):
        return self.call_kernel(kernel, args, kwargs), TaskToken("submit")

    def _spmd_submit(self, kernel, *args, core_num=1, deps=None, **kwargs):
        result = None
        saved = self.block_idx, self.block_num
        try:
            for b in range(int(core_num)):
                self.block_idx, self.block_num = b, int(core_num)
                result = self.call_kernel(kernel, args, kwargs)
        finally:
            self.block_idx, self.block_num = saved
        return result, TaskToken("spmd_submit")

    def _syncall(self, *args, **kwargs):
        raise NotSupportedError("not supported yet: pl.system.syncall (a barrier between concurrently running spmd "
                                "blocks; the reference executor runs blocks one after another)", user_span())


_INCORE_TYPES = (FunctionType.InCore, FunctionType.AIC, FunctionType.AIV, FunctionType.Group, FunctionType.Spmd)


def is_incore(kernel) -> bool:
    """A kernel function whose whole body is InCore code (`@pl.jit.incore`, an InCore-typed `pl.function`)."""
    return kernel.kind == "incore" or (kernel.kind == "function" and kernel.options.get("type") in _INCORE_TYPES)


def _opens_incore(scope) -> bool:
    return getattr(scope, "kind", None) == "at" and scope.level in (None, Level.CORE_GROUP)


_TARGET_POSITIONS: dict[str, int] = {}


def _written_argument(name, impl, param, args, kwargs):
    """The argument an in-place op writes (its `param`), found without binding the whole signature."""
    if param in kwargs:
        return kwargs[param]
    position = _TARGET_POSITIONS.get(name)
    if position is None:
        position = _TARGET_POSITIONS[name] = list(inspect.signature(impl).parameters).index(param)
    return args[position] if position < len(args) else None


def warn_directions_on_inline(kernel) -> None:
    """pl.Out/pl.InOut on an inline kernel's parameter carries no meaning (the caller's tensor is aliased)."""
    wrapped = [name for name, spec in kernel.annotations().items()
               if isinstance(spec, TensorType) and spec.direction in ("out", "inout")]
    if wrapped:
        warnings.warn_explicit(
            f"@pl.jit.inline {kernel.name}: pl.Out/pl.InOut on parameter(s) {', '.join(wrapped)} is ignored; "
            "inline parameters alias the caller's tensors, so annotate them as bare pl.Tensor",
            DeprecationWarning, kernel.fn.__code__.co_filename, kernel.fn.__code__.co_firstlineno)


def _describe(args) -> str:
    return ", ".join(repr(a) if isinstance(a, TensorValue) else type(a).__name__ if not isinstance(
        a, (int, float, bool)) else repr(a) for a in args)
