"""Compiling a kernel function once: its host program and kernels (or, for InCore code, one kernel).

Compiled artefacts live in the KernelFunction's own cache, keyed by what they were compiled for,
and are written to PYPTO_DUMP_DIR when it is set.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from dataclasses import dataclass
from typing import Callable

from pypto_rt import config
from pypto_rt.frontend.analyze import analyze, enclosing_statement
from pypto_rt.frontend.ir import FunctionIR
from pypto_rt.frontend.notes import warn_once
from pypto_rt.frontend.resolve import Env
from pypto_rt.incore_compiler import pycode
from pypto_rt.incore_compiler.coalesce import plan_coalescing
from pypto_rt.incore_compiler.compiler import KernelArtifact, compile_region
from pypto_rt.incore_compiler.torch_backend import loop_range
from pypto_rt.orchestration import program_cache
from pypto_rt.orchestration.hostgen import generate_host
from pypto_rt.replay import traced_code


@dataclass
class HostProgram:
    """A function's host code (submitting its regions) and the kernels of those regions."""
    ir: FunctionIR | None          # None when loaded from the disk cache
    run: Callable
    kernels: list[KernelArtifact]
    source: str
    compile_ms: float
    factory: pycode.Factory
    coalesce: str = "1"             # PYPTO_COALESCE when compiled (its traced variant is compiled the same way)
    notes: tuple = ()               # frontend.notes.StyleNote found when compiling (kept in the disk cache)


def host_program(kernel, traced: bool = False, coalesce: str | None = None) -> HostProgram:
    """The compiled host program of a `@pl.jit` / inline / opaque / program function for `coalesce` (default: the
    PYPTO_COALESCE in force; one program per setting): from this process's cache, else the disk cache, else
    compiled now (and stored). `traced`: the variant a run recorded for replay executes (see
    replay.traced_code), compiled when first needed and kept in this process only."""
    coalesce = config.COALESCE.get() if coalesce is None else coalesce
    programs = kernel.state.host_programs_traced if traced else kernel.state.host_programs
    program = programs.get(coalesce)
    if program is None:
        with config.scope(COALESCE=coalesce):
            if traced:   # the same program, arithmetic routed
                program = programs[coalesce] = _compile_host(kernel, traced=True)
                for index, artifact in enumerate(program.kernels):
                    artifact.plain_variant = functools.partial(_plain_kernel, kernel, index, coalesce)
            else:
                program = programs[coalesce] = _load_or_compile(kernel)
    return program


def _load_or_compile(kernel) -> HostProgram:
    with _gc_paused():
        start = time.perf_counter()
        program = program_cache.load(kernel, lambda kernels, factory, source, notes: _from_factory(
            kernel, kernels, factory, source, start, notes))
        if program is None:
            program = _compile_host_now(kernel)
            program_cache.store(kernel, program)
    warn_once(kernel, program.notes)
    for index, artifact in enumerate(program.kernels):
        artifact.traced_variant = functools.partial(_traced_kernel, kernel, index, program.coalesce)
    return program


def _traced_kernel(kernel, index: int, coalesce: str) -> KernelArtifact:
    return host_program(kernel, traced=True, coalesce=coalesce).kernels[index]


def _plain_kernel(kernel, index: int, coalesce: str) -> KernelArtifact:
    return host_program(kernel, coalesce=coalesce).kernels[index]


def _from_factory(kernel, kernels, factory, source, start, notes=()) -> HostProgram:
    (run,) = factory.instantiate(program_cache.host_values(kernels, Env(kernel.fn)), kernel.fn.__globals__)
    return HostProgram(None, run, kernels, source, (time.perf_counter() - start) * 1e3, factory,
                       config.COALESCE.get(), tuple(notes))


def _compile_host(kernel, traced: bool = False) -> HostProgram:
    with _gc_paused():
        return _compile_host_now(kernel, traced)


@contextlib.contextmanager
def _gc_paused():
    """Load, compile and store with the cyclic garbage collector paused: compiling allocates thousands of
    short-lived AST nodes, which would otherwise trigger full collections over torch's ~10^5 objects (~80 ms each
    here)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _compile_host_now(kernel, traced: bool = False) -> HostProgram:
    start = time.perf_counter()
    ir = analyze(kernel, context="host")
    env = Env(kernel.fn)
    module_globals = kernel.fn.__globals__
    if config.COALESCE.get() == "1":
        for r in ir.regions:
            if r.tid_target is None and not any(k.arg in ("deps", "no_dep_args") for k in r.call.keywords):
                r.coalesce = plan_coalescing(env, r, enclosing_statement(ir.tree, r.stmt))
    kernels = [compile_region(ir, r, env, module_globals, traced=traced) for r in ir.regions]
    tree = generate_host(ir)
    values = program_cache.host_values(kernels, env)
    if traced:
        traced_code.route(tree, module_globals, set(module_globals) | set(env.closure))
        values.update(traced_code.RUNTIME_NAMES, __range=loop_range)   # loop_range pins through int()
    factory, (run,) = pycode.build_functions([tree], values, ir.file, module_globals, tree)
    source = pycode.source_of([tree], f"# pypto-rt host program of {ir.name} ({ir.file})")
    program = HostProgram(ir, run, kernels, source, (time.perf_counter() - start) * 1e3, factory,
                          config.COALESCE.get(), tuple(ir.notes))
    if not traced:
        dump(ir, "host", source, [k.kernel.source for k in kernels])
    return program


def dump(ir: FunctionIR, what: str, source: str, kernel_sources=()) -> None:
    folder = config.DUMP_DIR.get()
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    stem = f"{os.path.splitext(os.path.basename(ir.file))[0]}.{ir.name}"
    with open(os.path.join(folder, f"{stem}.{what}.py"), "w") as f:
        f.write(source)
    for i, text in enumerate(kernel_sources):
        with open(os.path.join(folder, f"{stem}.kernel{i}.py"), "w") as f:
            f.write(text)
