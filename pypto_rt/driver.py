"""Runs `@pl.jit` entry calls: binds arguments, picks the executor (PYPTO_EXECUTOR), unwraps results.

The language layer reaches this module through one deferred import in
`KernelFunction.__call__`; nothing else in `language/` imports upward.
"""
from __future__ import annotations

from dataclasses import dataclass

from pypto_rt import config
from pypto_rt.binding import Binding, bind_call
from pypto_rt.errors import NotSupportedError, PyptoError, strip_internal_frames
from pypto_rt.language._runtime import activate
from pypto_rt.ops.value import TensorValue


@dataclass
class CompiledKernel:
    """What `kernel.compile(...)` returns: the checked entry, ready to run."""
    kernel: object
    binding: Binding
    executor: str
    output_dir: str | None = None


def _make_executor(binding: Binding):
    name = config.EXECUTOR.get()
    if name == "compiled":
        raise NotSupportedError("PYPTO_EXECUTOR=compiled: the compiled runtime is not available in this build yet",
                                hint="unset PYPTO_EXECUTOR to use the reference executor")
    from pypto_rt.reference.executor import ReferenceExecutor
    return ReferenceExecutor(binding)


def compile_entry(kernel, args: tuple, kwargs: dict) -> CompiledKernel:
    """Check an entry call's arguments and prepare its executor's code."""
    try:
        binding = bind_call(kernel, args, kwargs)
        executor = _make_executor(binding)
    except PyptoError as e:
        raise e.with_traceback(strip_internal_frames(e.__traceback__)) from None
    return CompiledKernel(kernel, binding, type(executor).__name__)


def run_entry(kernel, args: tuple, kwargs: dict):
    """Run an entry call; Out/InOut tensors are written in place, the kernel's return value is returned."""
    try:
        binding = bind_call(kernel, args, kwargs)
        executor = _make_executor(binding)
        with activate(executor):
            result = executor.run_entry(kernel)
    except PyptoError as e:
        raise e.with_traceback(strip_internal_frames(e.__traceback__)) from None
    return unwrap(result)


def unwrap(result):
    """TensorValues back to torch tensors (the caller's own tensors for parameters)."""
    if isinstance(result, TensorValue):
        return result.data
    if isinstance(result, tuple):
        return tuple(unwrap(r) for r in result)
    if isinstance(result, list):
        return [unwrap(r) for r in result]
    return result
