"""Binding a `@pl.jit` entry call's arguments to the kernel's parameters.

Checks count, kinds, dtypes and `pl.dynamic` consistency, and reports a mismatch at the caller's
line. Like the real `@pl.jit`, a call specialises on the extents of the tensors passed: a static
extent (or rank) that differs from the annotation gives one EntryShapeWarning per kernel and shape.
Tensors must be dense and hold data, and an Out/InOut one must not have elements sharing memory.
They are wrapped as `TensorValue`s sharing the caller's storage, so Out/InOut writes land in place.
Shared by every executor.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field

import torch

from pypto_rt.errors import EntryShapeWarning, KernelArgumentError, OpError, user_span
from pypto_rt.language.types import DynVar, ScalarType, TensorType
from pypto_rt.ops import dtype_rules
from pypto_rt.ops.value import TensorValue


@dataclass
class Binding:
    """A bound call: values in parameter order, In-parameter storages, dynamic dim values."""
    names: list[str]
    values: list
    readonly: dict[int, str] = field(default_factory=dict)  # storage data_ptr -> In parameter name
    dyn: dict[DynVar, int] = field(default_factory=dict)
    warned_writes: set[str] = field(default_factory=set)   # In parameters whose write was reported (once each)
    shape_notes: list = field(default_factory=list)        # (parameter, shape passed, how it differs from annotated)


def bind_call(kernel, args: tuple, kwargs: dict) -> Binding:
    """Bind and check an entry call; raises KernelArgumentError at the caller's line."""
    try:
        binding = _bind(kernel, args, kwargs)
    except KernelArgumentError as e:
        raise e.at(user_span(3)) from None   # the caller's line, found only when there is an error to report
    if binding.shape_notes:
        _warn_shape(kernel, binding.shape_notes)
    return binding


def _warn_shape(kernel, notes: list) -> None:
    """One EntryShapeWarning per kernel and argument shapes, at the caller's line."""
    key = tuple((name, tuple(actual)) for name, actual, _ in notes)
    warned = kernel.state.shape_warnings
    if key in warned:
        return
    warned.add(key)
    span = user_span()
    which = "; ".join(f"'{name}' has shape {list(actual)} ({how})" for name, actual, how in notes)
    warnings.warn_explicit(
        f"{kernel.name}: {which}. The call runs for the shapes passed, as the real @pl.jit does; code that assumes "
        "the annotated shape may reach past the tensor, which fails at that op's line (pass tensors of the "
        "annotated shape, or annotate a dim that varies with pl.dynamic)",
        EntryShapeWarning, span.file if span else "<unknown>", span.line if span else 0)


def _bind(kernel, args: tuple, kwargs: dict) -> Binding:
    state = kernel.state
    sig = state.signature
    if sig is None:
        sig = state.signature = inspect.signature(kernel.fn)
        state.plain_params = _plain_params(sig)
    where = None   # bind_call places the error
    plain = state.plain_params
    if plain is not None and not kwargs and len(args) == len(plain):
        # every parameter passed positionally (the common call): no inspect binding, same checks per argument
        ann = kernel.annotations()
        binding = Binding(list(plain), [])
        binding.values = [_bind_one(kernel, name, ann.get(name), arg, binding, where) for name, arg in zip(plain, args)]
        return binding
    try:
        bound = sig.bind_partial(*args, **kwargs)
    except TypeError as e:
        raise KernelArgumentError(f"{kernel.name}: {e}", where, _signature_hint(kernel, sig)) from None
    ann = kernel.annotations()
    binding = Binding([], [])
    missing = [p for p in sig.parameters if p not in bound.arguments]
    for name, param in sig.parameters.items():
        spec = ann.get(name)
        if name in bound.arguments:
            value = _bind_one(kernel, name, spec, bound.arguments[name], binding, where)
        elif param.default is not inspect.Parameter.empty:
            value = param.default
        else:
            value = None  # allocated below if it is an output
        binding.names.append(name)
        binding.values.append(value)
    _allocate_outputs(kernel, sig, ann, missing, binding, where)
    return binding


def _plain_params(sig) -> tuple[str, ...] | None:
    """The parameter names when all are plain positional-or-keyword ones (no *args, **kw, keyword-only)."""
    kinds = {p.kind for p in sig.parameters.values()}
    return tuple(sig.parameters) if kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD} else None


def _signature_hint(kernel, sig) -> str:
    return f"{kernel.name}{sig} is defined at {kernel.span}" if kernel.span else f"the kernel is {kernel.name}{sig}"


def _bind_one(kernel, name, spec, arg, binding: Binding, where):
    if isinstance(spec, TensorType):
        return _bind_tensor(kernel, name, spec, arg, binding, where)
    if isinstance(spec, ScalarType):
        return _bind_scalar(kernel, name, spec, arg, where)
    if isinstance(arg, torch.Tensor):
        _check_has_data(kernel, name, arg, where)
        return TensorValue(arg, dtype_rules.from_torch(arg.dtype))
    return arg


def _bind_tensor(kernel, name, spec: TensorType, arg, binding: Binding, where):
    if isinstance(arg, TensorValue):
        arg = arg.data
    if not isinstance(arg, torch.Tensor):
        raise KernelArgumentError(f"{kernel.name}: argument '{name}' must be a torch.Tensor, got "
                                  f"{type(arg).__name__}", where)
    _check_has_data(kernel, name, arg, where)
    try:
        dtype = dtype_rules.from_torch(arg.dtype)
    except OpError as e:
        raise KernelArgumentError(f"{kernel.name}: argument '{name}': {e.message}", where) from None
    if spec.dtype is not None and dtype != spec.dtype and dtype_rules.storage_dtype(spec.dtype) != arg.dtype:
        raise KernelArgumentError(f"{kernel.name}: argument '{name}' has dtype {arg.dtype}, the kernel expects "
                                  f"{spec.dtype!r} ({dtype_rules.storage_dtype(spec.dtype)})", where,
                                  f"convert it with .to({dtype_rules.storage_dtype(spec.dtype)})")
    if spec.shape is not None:
        _check_shape(kernel, name, spec.shape, tuple(arg.shape), binding, where)
    if spec.direction == "in":
        if arg.untyped_storage().nbytes():   # (empty tensors share data_ptr 0: they alias nothing)
            binding.readonly[arg.untyped_storage().data_ptr()] = name
    elif spec.direction != "window" and _overlaps_itself(arg):
        wrapper = "pl.Out" if spec.direction == "out" else "pl.InOut"
        raise KernelArgumentError(
            f"{kernel.name}: argument '{name}' is written by the kernel ({wrapper}), but several of its elements are "
            f"one memory location (shape {list(arg.shape)}, strides {list(arg.stride())}: an expand()ed or "
            "stride-0 view), so the writes would land on each other", where,
            f"pass a tensor with storage of its own (torch.empty({list(arg.shape)}, dtype={arg.dtype}), or "
            f"{name}.clone()) and read the results from it")
    return TensorValue(arg, spec.dtype or dtype)


def _check_has_data(kernel, name, arg: torch.Tensor, where) -> None:
    """Kernels read and write dense strided memory: no sparse layouts, no meta tensors (shapes without data)."""
    if arg.layout is not torch.strided:
        layout = str(arg.layout).removeprefix("torch.")
        raise KernelArgumentError(f"{kernel.name}: argument '{name}' is a sparse tensor (layout {layout}); kernels "
                                  "read and write dense tensors", where, f"pass {name}.to_dense()")
    if arg.is_meta:
        raise KernelArgumentError(f"{kernel.name}: argument '{name}' is a meta tensor: it has a shape but no data",
                                  where, f"pass a tensor with data, e.g. torch.zeros({list(arg.shape)}, "
                                  f"dtype={arg.dtype})")


def _overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of `t` share memory (torch's own check, as its in-place ops make; 2, "too hard to
    tell", counts as no, as it does there)."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is not None:
        return check(t) == 1
    return any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape))


def _check_shape(kernel, name, expected, actual, binding: Binding, where):
    """Bind `pl.dynamic` dims. The call specialises on `actual` (as the real `@pl.jit` does): a static extent or a
    rank that differs from the annotation is only noted, for `_warn_shape`."""
    differ = []
    for axis, (want, got) in enumerate(zip(expected, actual)):
        if isinstance(want, DynVar):
            seen = binding.dyn.setdefault(want, got)
            if seen != got:
                raise KernelArgumentError(
                    f"{kernel.name}: argument '{name}' axis {axis} is {got}, but dynamic dim {want.name} is already "
                    f"{seen} from an earlier argument", where)
        elif isinstance(want, int) and want != got:
            differ.append(str(axis))
    if len(expected) != len(actual):
        binding.shape_notes.append((name, actual, f"rank {len(actual)}, annotated {_fmt(expected)}"))
    elif differ:
        axes = f"axis {differ[0]} differs" if len(differ) == 1 else f"axes {', '.join(differ)} differ"
        binding.shape_notes.append((name, actual, f"annotated {_fmt(expected)}, {axes}"))


def _fmt(shape) -> str:
    return "[" + ", ".join(d.name if isinstance(d, DynVar) else str(d) for d in shape) + "]"


def _bind_scalar(kernel, name, spec: ScalarType, arg, where):
    if isinstance(arg, torch.Tensor) and arg.numel() == 1:
        arg = arg.item()
    if not isinstance(arg, (int, float, bool)):
        raise KernelArgumentError(f"{kernel.name}: argument '{name}' is a pl.Scalar and must be a Python number, "
                                  f"got {type(arg).__name__}", where)
    dt = spec.dtype
    if dt is not None and dt.is_int():
        if isinstance(arg, float) and not arg.is_integer():
            raise KernelArgumentError(f"{kernel.name}: argument '{name}' is {dt!r} but got {arg!r}", where)
        lo, hi = dtype_rules.int_range(dt)
        if not lo <= int(arg) <= hi:
            raise KernelArgumentError(f"{kernel.name}: argument '{name}' = {arg} does not fit {dt!r}", where)
        return int(arg)
    if dt is not None and dt.is_float():
        return float(arg)
    return arg


def _allocate_outputs(kernel, sig, ann, missing, binding: Binding, where):
    """Return style: trailing Out parameters left out of the call are allocated here."""
    for name in missing:
        if sig.parameters[name].default is not inspect.Parameter.empty:
            continue
        spec = ann.get(name)
        if not (isinstance(spec, TensorType) and spec.direction == "out" and spec.shape is not None):
            raise KernelArgumentError(f"{kernel.name}: missing argument '{name}'", where,
                                      _signature_hint(kernel, sig))
        shape = [binding.dyn.get(d) if isinstance(d, DynVar) else d for d in spec.shape]
        if any(d is None for d in shape):
            raise KernelArgumentError(f"{kernel.name}: cannot allocate output '{name}': its shape {_fmt(spec.shape)}"
                                      " uses a dynamic dim no input defines", where, "pass the output tensor")
        data = torch.zeros(shape, dtype=dtype_rules.storage_dtype(spec.dtype))
        binding.values[binding.names.index(name)] = TensorValue(data, spec.dtype)
