"""What crosses a host-form job's pipes: which kernel to run, its arguments, and a failure's report.

Host to rank: ("store", port, secret), ("alloc", nbytes), ("run", sequence, kernel_ref, args, kwargs), ("exit",).
Rank to host: ("ok",) for an alloc, ("done", sequence, entry_shape_warnings), ("error", report), ("alive", cpu_s).
A kernel travels as (module, qualname), or as its creation serial when a factory made it: the forked rank has
the same modules and the kernels made before the fork. An argument travels as a view of one
of the entry's tensors (shared memory since before the fork), a window view, or the value itself.
"""
from __future__ import annotations

import sys
import traceback

from pypto_rt.aicpu.failures import StallError
from pypto_rt.collective import process
from pypto_rt.collective.base import CommTimeoutError
from pypto_rt.errors import NotSupportedError, error_chain, find_wait, strip_internal_frames
from pypto_rt.language.decorators import KernelFunction
from pypto_rt.ops.value import TensorValue


def kernel_ref(kernel, span) -> tuple:
    """How a rank finds `kernel`: ("name", module, qualname) when that name leads to it, else ("made", serial)
    (a kernel a factory made: the rank, forked after it was made, has it under the same serial)."""
    module = getattr(kernel.fn, "__module__", None)
    if module not in sys.modules:
        raise NotSupportedError(f"cannot dispatch {kernel.name}: its module is not importable", span)
    qualname = kernel.fn.__qualname__
    if "<locals>" not in qualname:
        return "name", module, qualname
    return "made", kernel.serial


def resolve_kernel(ref: tuple):
    """The rank's own object for a `kernel_ref`."""
    if ref[0] == "made":
        kernel = KernelFunction.made(ref[1])
        if kernel is None:
            raise NotSupportedError("a host-form program dispatched a kernel made after its rank processes "
                                    "started", hint="make the kernel (call its factory) at module level, before "
                                    "the @pl.jit.host program runs")
        return kernel
    _, module, qualname = ref
    target = sys.modules[module]
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def describe_argument(value, binding, span):
    """How a rank rebuilds an argument: a view of an entry tensor, a window view, or the value itself."""
    if isinstance(value, TensorValue):
        value = value.data
    if isinstance(value, process.HostWindowView):
        return ("window", value.buffer.index, value.shape, value.dtype)
    if hasattr(value, "untyped_storage"):
        ptr = value.untyped_storage().data_ptr()
        for index, base in enumerate(binding.values):
            if isinstance(base, TensorValue) and base.data.untyped_storage().data_ptr() == ptr:
                return ("tensor", index, value.storage_offset(), tuple(value.shape), tuple(value.stride()))
        raise NotSupportedError("a device= dispatch can pass the host program's own tensor parameters (and "
                                "views of them), windows and scalars; this tensor was made in the host body",
                                span, "pass it in as a parameter of the @pl.jit.host function")
    return ("value", value)


def rebuild_argument(described, binding):
    """The rank's side of `describe_argument`."""
    kind = described[0]
    if kind == "value":
        return described[1]
    if kind == "tensor":
        _, index, offset, shape, stride = described
        return binding.values[index].data.as_strided(shape, stride, offset)
    _, index, shape, dtype = described
    from pypto_rt.language.distributed import window
    return window(process.local_buffers()[index], shape, dtype)


def failure_report(error: BaseException, failed_at: float) -> dict:
    """The rendered error (user frames only), when it happened (the host orders failures by it, not by arrival),
    the first wait report found in its chain, and whether the error is a stall (a wait past its deadline, an
    engine without progress) rather than an exception user code raised."""
    render = getattr(error, "render", None)
    if render is not None:
        text = render()
    else:
        text = "".join(traceback.format_exception(type(error), error, strip_internal_frames(error.__traceback__)))
    return {"message": text.rstrip(), "time": failed_at, "wait": find_wait(error), "stalled": _stalled(error)}


def _stalled(error: BaseException) -> bool:
    """Whether `error`'s chain holds a timed-out wait or an engine stall."""
    return any(isinstance(e, (CommTimeoutError, StallError)) for e in error_chain(error))
