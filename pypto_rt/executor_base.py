"""What every executor of kernel code shares, and nothing more: `pl` ops dispatched to the op library (with the
In-parameter write check and user-located errors), loops in program order with carried values, sub-block lanes,
scopes, block intrinsics and `bind_dynamic`.

The reference executor (the semantic oracle), the compiled runtime's HostExecutor and KernelExecutor, each derive
from `ExecutorBase` and decide how a kernel call runs (`call_kernel`) and what they refuse; none derives from
another, so the oracle never carries what the product needs. `language._runtime.Executor` is what the `pl`
surface calls; this base implements it.
"""
from __future__ import annotations

import inspect
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass

from pypto_rt.errors import DSLError, InWriteWarning, NotSupportedError, OpError, PyptoError, UnknownOpError, user_span
from pypto_rt.language.enums import FunctionType, Level, SplitMode
from pypto_rt.language.scopes import Loop
from pypto_rt.language.types import TensorType
from pypto_rt.ops import OPS
from pypto_rt.ops.registry import IN_PLACE_TARGETS
from pypto_rt.ops.system import TaskToken
from pypto_rt.ops.value import TensorValue

_SIGNATURES: dict[str, inspect.Signature] = {}
_TORCH_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


@dataclass
class _Carried:
    values: tuple


class ExecutorBase(ABC):
    """Runs kernel code of one entry call on the op library; subclasses say how kernel calls run."""

    # intrinsics: op names answered from executor state -> the method answering them (looked up per call, so
    # subclasses can add theirs and constructing an executor stays cheap: one is made per task block)
    INTRINSICS = {
        "get_block_idx": "_block_idx", "tile.get_block_idx": "_block_idx", "tensor.get_block_idx": "_block_idx",
        "get_block_num": "_block_num", "tile.get_block_num": "_block_num", "tensor.get_block_num": "_block_num",
        "get_subblock_idx": "_subblock_idx", "tile.get_subblock_idx": "_subblock_idx",
        "aiv_shard": "_aiv_shard", "tile.aiv_shard": "_aiv_shard", "aic_gather": "_aic_gather",
        "tile.aic_gather": "_aic_gather",
        "submit": "_submit", "spmd_submit": "_spmd_submit", "system.syncall": "_syncall",
    }

    def __init__(self, binding):
        self.binding = binding
        self.block_idx = 0
        self.block_num = 1
        self.subblock_idx = 0
        self.aiv_split: tuple[int, int] | None = None   # (axis, lanes) inside a data-parallel pl.split_aiv region
        self.carried: list[_Carried] = []
        self.incore_depth = 0   # > 0 while running InCore code (a pl.at or pl.spmd body, an InCore function)

    @abstractmethod
    def call_kernel(self, kernel, args, kwargs):
        """Run a call of kernel function `kernel` made from kernel code (or the entry call)."""

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
            _bind(name, impl, args, kwargs)  # a signature mismatch is reported as such
            raise OpError(f"pl.{name} failed on ({_describe(args)}): {e}", user_span()) from e

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
        """A `pl.range`-like loop in program order, or `pl.split_aiv`'s lanes; a subclass handles `pl.spmd`."""
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

    def _aiv_lanes(self, loop: Loop):
        """Every lane in turn (aiv_id 0, 1, ...). In a data-parallel region (UP_DOWN / LEFT_RIGHT) a lane holds its
        part of each tile crossing from the cube (`pl.aiv_shard`: its rows / columns), as the real compiler halves
        the vector side of the region; a task-parallel one (NONE) sees whole tiles."""
        split = None if loop.mode in (None, SplitMode.NONE) else (0 if loop.mode == SplitMode.UP_DOWN else 1,
                                                                   int(loop.stop))
        saved = self.subblock_idx, self.aiv_split
        try:
            for lane in range(int(loop.stop)):
                self.subblock_idx, self.aiv_split = lane, split
                yield lane
        finally:
            self.subblock_idx, self.aiv_split = saved

    def yield_(self, values):
        if self.carried:
            self.carried[-1].values = tuple(values)
        return values[0] if len(values) == 1 else tuple(values)

    def enter_scope(self, scope):
        self.incore_depth += opens_incore(scope)
        return TaskToken(getattr(scope, "name_hint", "") or "")

    def exit_scope(self, scope, failed):
        self.incore_depth -= opens_incore(scope)

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

    def _aiv_shard(self, x):
        """The cube -> vector crossing: in a data-parallel pl.split_aiv region this lane's equal part of `x` along
        the split axis (rows for UP_DOWN, columns for LEFT_RIGHT); elsewhere `x` itself."""
        if self.aiv_split is None:
            return OPS["aiv_shard"](x)
        axis, lanes = self.aiv_split
        if not isinstance(x, TensorValue) or x.ndim != 2 or x.shape[axis] % lanes:
            raise OpError(f"pl.aiv_shard: in a pl.split_aiv region of {lanes} lanes split along axis {axis}, the "
                          f"tile must be 2-D with that axis a multiple of {lanes}, got {_describe((x,))}",
                          user_span())
        part = x.shape[axis] // lanes
        shape, offset = list(x.shape), [0, 0]
        shape[axis], offset[axis] = part, self.subblock_idx * part
        return OPS["slice"](x, shape, offset)

    def _aic_gather(self, x):
        """The vector -> cube crossing: `x` itself outside a data-parallel region; inside one it would join every
        lane's part, which lanes run one after another here cannot give."""
        if self.aiv_split is not None:
            raise NotSupportedError("pl.aic_gather in a data-parallel pl.split_aiv region (UP_DOWN / LEFT_RIGHT) "
                                    "joins every lane's part; this runtime runs the lanes one after another",
                                    user_span(), "gather on the cube side after the region, or use "
                                    "mode=pl.SplitMode.NONE")
        return OPS["aic_gather"](x)

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
                                "blocks; pypto-rt runs a kernel's blocks without one)", user_span())


def refuse_unrunnable(kernel, kwargs) -> None:
    """Kernel calls no executor runs here: hand-written device code, and `device=` outside a host-form program."""
    if kernel.kind == "extern":
        raise NotSupportedError(f"not supported yet: @pl.jit.extern kernel {kernel.name} (hand-written device "
                                "C++ cannot run on the CPU)", user_span())
    if "device" in kwargs:
        raise NotSupportedError(f"not supported yet: dispatching {kernel.name} with device= (multi-rank host "
                                "programs come with the multi-rank runtime)", user_span())


_INCORE_TYPES = (FunctionType.InCore, FunctionType.AIC, FunctionType.AIV, FunctionType.Group, FunctionType.Spmd)


def is_incore(kernel) -> bool:
    """A kernel function whose whole body is InCore code (`@pl.jit.incore`, an InCore-typed `pl.function`)."""
    return kernel.kind == "incore" or (kernel.kind == "function" and kernel.options.get("type") in _INCORE_TYPES)


def opens_incore(scope) -> bool:
    """A `pl.at` scope whose body is InCore code."""
    return getattr(scope, "kind", None) == "at" and scope.level in (None, Level.CORE_GROUP)


def warn_directions_on_inline(kernel) -> None:
    """pl.Out/pl.InOut on an inline kernel's parameter carries no meaning (the caller's tensor is aliased)."""
    wrapped = [name for name, spec in kernel.annotations().items()
               if isinstance(spec, TensorType) and spec.direction in ("out", "inout")]
    if wrapped:
        warnings.warn_explicit(
            f"@pl.jit.inline {kernel.name}: pl.Out/pl.InOut on parameter(s) {', '.join(wrapped)} is ignored; "
            "inline parameters alias the caller's tensors, so annotate them as bare pl.Tensor",
            DeprecationWarning, kernel.fn.__code__.co_filename, kernel.fn.__code__.co_firstlineno)


def _bind(name, impl, args, kwargs) -> inspect.BoundArguments:
    sig = _SIGNATURES.get(name)
    if sig is None:
        sig = _SIGNATURES[name] = inspect.signature(impl)
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as e:
        raise OpError(f"pl.{name}: {e}", user_span(), f"the signature is pl.{name}{sig}") from None


_TARGET_POSITIONS: dict[str, int] = {}


def _written_argument(name, impl, param, args, kwargs):
    """The argument an in-place op writes (its `param`), found without binding the whole signature."""
    if param in kwargs:
        return kwargs[param]
    position = _TARGET_POSITIONS.get(name)
    if position is None:
        position = _TARGET_POSITIONS[name] = list(inspect.signature(impl).parameters).index(param)
    return args[position] if position < len(args) else None


def _describe(args) -> str:
    return ", ".join(repr(a) if isinstance(a, TensorValue) else type(a).__name__ if not isinstance(
        a, (int, float, bool)) else repr(a) for a in args)
