"""One compiled entry call: an engine for the run, the HostExecutor on this thread, a join at the end."""
from __future__ import annotations

from pypto_rt.aicpu import Engine
from pypto_rt.language._runtime import activate
from pypto_rt.orchestration.host import HostExecutor, is_incore
from pypto_rt.orchestration.program import host_program
from pypto_rt.incore_compiler.compiler import incore_kernel


def run_compiled(kernel, binding):
    """Run `kernel` bound to `binding` on the compiled runtime; returns the entry's return value."""
    engine = Engine(name=kernel.name)
    executor = HostExecutor(binding, engine)
    try:
        with activate(executor):
            result = executor.run_entry(kernel)
        engine.finish()
    finally:
        engine.close()
    return result


def compile_only(kernel) -> float:
    """Compile `kernel` (host program and kernels) without running it; returns the compile time in ms."""
    kernel = getattr(kernel, "kernel", kernel)   # a @pl.program method bound to its instance
    if is_incore(kernel):
        return incore_kernel(kernel).compile_ms
    return host_program(kernel).compile_ms
