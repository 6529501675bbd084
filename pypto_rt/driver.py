"""Runs `@pl.jit` entry calls: binds arguments, picks the executor (PYPTO_EXECUTOR), unwraps results.

The language layer reaches this module through one deferred import in
`KernelFunction.__call__`; nothing else in `language/` imports upward.
"""
from __future__ import annotations

from dataclasses import dataclass

from pypto_rt import config, options
from pypto_rt.binding import Binding, bind_call
from pypto_rt.errors import PyptoError, strip_internal_frames
from pypto_rt.language._runtime import activate
from pypto_rt.ops.value import TensorValue


@dataclass
class CompiledEntry:
    """What `kernel.compile(*args, config=...)` returns: the entry, its arguments checked and its host program and
    kernels compiled (compiled executor). Calling it runs the kernel as a plain call does (same checks, for the
    arguments given then), with `config`'s options (an `Options` or dict of them) applied to that call."""
    kernel: object
    binding: Binding
    executor: str
    config: options.Options

    def __call__(self, *args, **kwargs):
        with options.scoped(self.config):
            return run_entry(self.kernel, args, kwargs)


def compile_entry(kernel, args: tuple, kwargs: dict, settings=None) -> CompiledEntry:
    """Check an entry call's arguments and compile its host program and kernels (compiled executor), with
    `settings` (None, an `Options` or a dict of option values) in force."""
    try:
        chosen = options.as_options(settings)
        with options.scoped(chosen):
            binding = bind_call(kernel, args, kwargs)
            executor = config.EXECUTOR.get()
            if executor == "compiled":
                from pypto_rt.orchestration.run import compile_only
                compile_only(kernel)
    except PyptoError as e:
        raise e.with_traceback(strip_internal_frames(e.__traceback__)) from None
    return CompiledEntry(kernel, binding, executor, chosen)


def run_entry(kernel, args: tuple, kwargs: dict):
    """Run an entry call; Out/InOut tensors are written in place, the kernel's return value is returned."""
    try:
        if kernel.state.replay_by_arguments and not kwargs:   # a call like one replayed before (compiled executor)
            replay = _replay or _replay_entry()
            result = replay.by_arguments(kernel, args)
            if result is not replay.MISS:
                return result   # (the caller's tensors already)
        binding = bind_call(kernel, args, kwargs)
        if kernel.kind == "host":   # a multi-rank host program: its body here, its dispatches on rank processes
            from pypto_rt.host_form.host_body import run_host
            result = run_host(kernel, binding)
        elif config.EXECUTOR.get() == "compiled":
            from pypto_rt.orchestration.run import run_compiled  # the compiled runtime sits above the driver
            result = run_compiled(kernel, binding, None if kwargs else args)
        else:
            from pypto_rt.reference.executor import ReferenceExecutor
            executor = ReferenceExecutor(binding)
            with activate(executor):
                result = executor.run_entry(kernel)
    except PyptoError as e:
        raise e.with_traceback(strip_internal_frames(e.__traceback__)) from None
    return unwrap(result)


_replay = None   # replay.entry (its `by_arguments`: the replayed call's fast path), imported when a kernel first has
                 # a replay (the compiled runtime sits below the driver; a module, read per call, as tests patch it)


def _replay_entry():
    global _replay
    if _replay is None:
        from pypto_rt.replay import entry
        _replay = entry
    return _replay


def unwrap(result):
    """TensorValues back to torch tensors (the caller's own tensors for parameters)."""
    if isinstance(result, TensorValue):
        return result.data
    if isinstance(result, tuple):
        return tuple(unwrap(r) for r in result)
    if isinstance(result, list):
        return [unwrap(r) for r in result]
    return result
