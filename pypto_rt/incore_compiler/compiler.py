"""Outlined regions and `@pl.jit.incore` functions -> backend kernels with submit-time access plans.

A `KernelArtifact` is everything a task submission needs: the backend's `run(block, *inputs)`, the
`accesses(*inputs)` function giving the boxes each tensor input is read/written in, and the
readable generated source.
"""
from __future__ import annotations

import ast
import re
import time
from dataclasses import dataclass
from typing import Callable

from pypto_rt import config
from pypto_rt.frontend.analyze import analyze
from pypto_rt.frontend.ir import FunctionIR, InCoreRegion
from pypto_rt.frontend.notes import warn_once
from pypto_rt.frontend.resolve import Env
from pypto_rt.frontend.source import span_of
from pypto_rt.incore_compiler import pycode
from pypto_rt.incore_compiler.accesses import plan_accesses
from pypto_rt.incore_compiler.coalesce import EXTENT, coalesced_body, merge_tile_loops
from pypto_rt.incore_compiler.kernel_ir import GeneratedKernel, KernelIR
from pypto_rt.incore_compiler.torch_backend import TorchBackend

BACKENDS = {"torch": TorchBackend()}


@dataclass
class KernelArtifact:
    kernel: GeneratedKernel
    accesses: Callable[..., tuple]     # accesses(*inputs) -> ((input index, mode, offsets, sizes, line), ...)
    compile_ms: float = 0.0
    factory: pycode.Factory | None = None   # of `accesses`
    # the artifact of the same kernel in the code variant a recorded run executes (replay.traced_code)
    traced_variant: Callable[[], "KernelArtifact"] | None = None
    # in the traced variant: the plain artifact it is a variant of (what a recorded run's opaque blocks call)
    plain_variant: Callable[[], "KernelArtifact"] | None = None

    @property
    def ir(self) -> KernelIR:
        return self.kernel.ir

    @property
    def atomic_entries(self) -> tuple[int, ...]:
        """Positions in the `accesses(...)` plan of the kernel's atomic adds (`pl.assemble(..., atomic=Add)`)."""
        found = self.__dict__.get("_atomic_entries")
        if found is None:
            params = set(self.ir.params)
            plan = [a for a in self.ir.accesses if a.param in params]   # (as `_access_function` lists them)
            found = self._atomic_entries = tuple(i for i, a in enumerate(plan) if a.atomic)
        return found


def compile_region(ir: FunctionIR, region: InCoreRegion, env: Env, module_globals: dict,
                   backend: str = "torch", traced: bool = False) -> KernelArtifact:
    """The kernel of one outlined region of `ir`."""
    hint = _literal_name_hint(region)
    body, params = region.body, list(region.live_ins)
    block_var = region.block_var
    c = region.coalesce
    if c is not None:
        body = coalesced_body(c)
        params = [p for p in params if p != c.dropped] + ([c.var] if c.new_offset else []) + [EXTENT]
        block_var = None
    if config.COALESCE.get() == "1":
        body = merge_tile_loops(env, body)
    display = hint or f"{ir.name.rsplit('.', 1)[-1]}_{region.kind}{region.index}"
    kir = KernelIR(name=_identifier(f"{display}_r{region.index}"), display=display, file=ir.file,
                   span=region.span, params=params, body=body, env=env, anchor=region.stmt,
                   block_var=block_var, results=list(region.results),
                   guards=[p for p in params if p in ir.unbound_guard],
                   coalesce_var=c.var if c else None, coalesce_untiled=c.untiled if c else (),
                   coalesce_dim=c.dim if c else 0)
    kir.accesses = plan_accesses(env, body, kir.params, block_var, region.aliased)
    return _finish(kir, module_globals, backend, traced)


def incore_kernel(kernel, backend: str = "torch", traced: bool = False) -> KernelArtifact:
    """A function run as InCore code throughout (`@pl.jit.incore`, or an inline kernel called from a kernel),
    compiled once per KernelFunction (`traced`: the variant a run recorded for replay executes, see traced_code)."""
    key = "incore_kernel_traced" if traced else "incore_kernel"
    artifact = getattr(kernel.state, key)
    if artifact is None:
        start = time.perf_counter()
        ir = analyze(kernel, context="incore")
        warn_once(kernel, ir.notes)
        artifact = compile_function(ir, Env(kernel.fn), kernel.fn.__globals__, backend, traced)
        artifact.compile_ms = (time.perf_counter() - start) * 1e3
        if traced:
            artifact.plain_variant = lambda: incore_kernel(kernel, backend)
        else:
            artifact.traced_variant = lambda: incore_kernel(kernel, backend, traced=True)
        setattr(kernel.state, key, artifact)
    return artifact


def compile_function(ir: FunctionIR, env: Env, module_globals: dict, backend: str = "torch",
                     traced: bool = False) -> KernelArtifact:
    """A function as one kernel with its own signature (defaults kept); its `return` gives the result."""
    tree = ir.tree
    signature = pycode.clone(tree.args)
    for a in signature.posonlyargs + signature.args + signature.kwonlyargs + [signature.vararg, signature.kwarg]:
        if a is not None:
            a.annotation = None
    signature.args.insert(0, ast.arg("__block"))
    kir = KernelIR(name=_identifier(ir.name), display=ir.name.rsplit(".", 1)[-1], file=ir.file,
                   span=span_of(ir.file, tree), params=list(ir.params), body=tree.body, env=env, anchor=tree,
                   returns_value=True, signature=signature)
    kir.accesses = plan_accesses(env, tree.body, kir.params)
    return _finish(kir, module_globals, backend, traced)


def _finish(kir: KernelIR, module_globals: dict, backend: str, traced: bool = False) -> KernelArtifact:
    compiled = BACKENDS[backend].compile(kir, module_globals, traced=traced)
    factory, (accesses,) = _access_function(kir, module_globals)
    return KernelArtifact(compiled, accesses, factory=factory)


def _access_function(kir: KernelIR, module_globals: dict):
    index = {p: i for i, p in enumerate(kir.params)}

    def exprs(items):
        if items is None:
            return ast.Constant(None)
        return ast.Tuple([pycode.clone(e) if e is not None else ast.Constant(None) for e in items], ast.Load())

    entries = [ast.Tuple([ast.Constant(index[a.param]), ast.Constant(a.mode), exprs(a.offsets), exprs(a.sizes),
                          ast.Constant(a.line)], ast.Load()) for a in kir.accesses if a.param in index]
    fdef = ast.FunctionDef(name=f"{kir.name}__accesses", args=pycode.arguments(kir.params),
                           body=[ast.Return(ast.Tuple(entries, ast.Load()))], decorator_list=[], returns=None,
                           **pycode._TYPE_PARAMS)
    pycode.located(fdef, kir.anchor)
    return pycode.build_functions([fdef], dict(kir.env.closure), kir.file, module_globals, kir.anchor)


def _literal_name_hint(region: InCoreRegion) -> str | None:
    hint = next((k.value for k in region.call.keywords if k.arg == "name_hint"), None)
    return hint.value if isinstance(hint, ast.Constant) and isinstance(hint.value, str) and hint.value else None


def _identifier(text: str) -> str:
    ident = re.sub(r"\W", "_", text)
    return ident if ident and not ident[0].isdigit() else "k_" + ident
