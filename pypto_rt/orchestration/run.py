"""One compiled entry call: an engine for the run, the HostExecutor on this thread, a join at the end."""
from __future__ import annotations

from pypto_rt.aicpu import Engine
from pypto_rt.language._runtime import activate
from pypto_rt.orchestration.host import HostExecutor, is_incore
from pypto_rt.orchestration.program import host_program
from pypto_rt.incore_compiler.compiler import incore_kernel
from pypto_rt.replay import entry as replay
from pypto_rt.run_stats import note_replay


def run_compiled(kernel, binding, args: tuple | None = None):
    """Run `kernel` bound to `binding` on the compiled runtime (or replay it, see `replay`); returns the entry's
    return value. `args`: the caller's positional arguments, when they were all positional."""
    off = replay.disabled()
    if off is not None:
        note_replay(kernel.name, off)
        return _run_on_engine(kernel, binding, inline=False)[0]
    return replay.run(kernel, binding, lambda inline: _run_on_engine(kernel, binding, inline), args)


def _run_on_engine(kernel, binding, inline: bool):
    """(the entry's return value, the engine's stats); inline: a recorded run, every block on this thread (one
    worker, so coalesced loops make one chunk; its communication blocks are recorded as opaque calls)."""
    engine = Engine(name=kernel.name, num_workers=1, inline=True) if inline else Engine(name=kernel.name)
    executor = HostExecutor(binding, engine)
    try:
        with activate(executor):
            result = executor.run_entry(kernel)
        engine.finish()
    finally:
        engine.close()
        executor.runner.forget_inputs()
    return result, engine.stats


def compile_only(kernel) -> float:
    """Compile `kernel` (host program and kernels) without running it; returns the compile time in ms."""
    kernel = getattr(kernel, "kernel", kernel)   # a @pl.program method bound to its instance
    if is_incore(kernel):
        return incore_kernel(kernel).compile_ms
    return host_program(kernel).compile_ms
