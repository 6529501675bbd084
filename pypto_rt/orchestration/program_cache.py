"""What the disk cache keeps of a compiled host program, and the program rebuilt from it: a warm start skips
parsing, analysis and code generation.

Key: the function's own compiled bytecode (it changes with any edit of its source, line numbers
included), its file and qualified name, the knobs that change generated code, the Python version and
the sources of the compiler and of the op library it reads (sizes and modification times). An entry holds the marshalled code object
of every generated factory and the plain data the runtime reads (names, spans, parameters, access
modes). A stale or foreign entry is a miss. Where entries live and whom they trust: pypto_rt.disk_cache.
"""
from __future__ import annotations

import functools
import hashlib
import marshal
import os
import sys

from pypto_rt import config, disk_cache
from pypto_rt.errors import Span
from pypto_rt.frontend.notes import StyleNote
from pypto_rt.frontend.resolve import Env
from pypto_rt.incore_compiler.accesses import ParamAccess
from pypto_rt.incore_compiler.compiler import KernelArtifact
from pypto_rt.incore_compiler.kernel_ir import UNBOUND, GeneratedKernel, KernelIR
from pypto_rt.incore_compiler.pycode import Factory
from pypto_rt.incore_compiler.torch_backend import RUNTIME_NAMES
from pypto_rt.language import _runtime
from pypto_rt.language.decorators import ProgramNamespace
from pypto_rt.ops import OPS
from pypto_rt.replay import tier

_FORMAT = 6   # 2: kernels record the inputs a coalesced loop merges only at extent 1; 3 (host `__key`) retired;
              # 5: accesses say which are atomic adds; 6: entries carry their compile's style warnings
# the compiler's packages, the op library whose declared facts (OpDef: writes, shapes) it compiles from, and the
# language surface whose tables it reads (which `pl` names stay executor intrinsics, not direct op calls)
_COMPILER_PACKAGES = ("frontend", "incore_compiler", "orchestration", "replay", "ops", "language")
_compiler_stamp: str | None = None


def load(kernel, make_program):
    """The cached program of `kernel`, rebuilt with `make_program(kernels, host_factory, host_source, notes)`."""
    if _needs_full_ir():
        return None
    entry = disk_cache.load(_key(kernel))
    if not isinstance(entry, dict) or entry.get("format") != _FORMAT:
        return None
    try:
        env = Env(kernel.fn)
        module_globals = kernel.fn.__globals__
        kernels = [_artifact(k, env, module_globals) for k in entry["kernels"]]
        host = Factory(entry["host"], tuple(entry["host_names"]))
        notes = tuple(StyleNote(*n) for n in entry["notes"])   # its compile's style warnings, given again
        return make_program(kernels, host, entry["source"], notes)
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss
        return None


def store(kernel, program) -> None:
    if _needs_full_ir():
        return
    disk_cache.store(_key(kernel), {
        "format": _FORMAT, "host": program.factory.code, "host_names": list(program.factory.names),
        "source": program.source, "kernels": [_describe(a) for a in program.kernels],
        "notes": [[n.message, n.file, n.line] for n in program.notes]})


def host_values(kernels, env: Env) -> dict:
    """What a host program's factory is instantiated with."""
    # `self`: the program namespace library kernels name their helpers through (see ProgramNamespace)
    return {"__host": _runtime.current, "__UNBOUND": UNBOUND, "__K": kernels,
            "self": ProgramNamespace(env.globals), **env.closure}


def _needs_full_ir() -> bool:
    """A debugging knob that needs the program's IR (checking regions, dumping code) bypasses the cache."""
    return bool(config.CHECK.get() or config.DUMP_DIR.get())


def _key(kernel) -> tuple:
    fn = kernel.fn
    return (marshal.dumps(fn.__code__), fn.__code__.co_filename, kernel.name, sys.version, config.COALESCE.get(),
            _stamp())


def _stamp() -> str:
    """Sizes and modification times of the compiler's sources: any change of the compiler invalidates entries."""
    global _compiler_stamp
    if _compiler_stamp is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        parts = []
        for package in _COMPILER_PACKAGES:
            for name in sorted(os.listdir(os.path.join(root, package))):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(root, package, name))
                    parts.append(f"{package}/{name}:{st.st_size}:{st.st_mtime_ns}")
        _compiler_stamp = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return _compiler_stamp


def _describe(artifact: KernelArtifact) -> dict:
    ir, compiled = artifact.ir, artifact.kernel
    return {"name": ir.name, "display": ir.display, "file": ir.file,
            "span": [ir.span.file, ir.span.line, ir.span.col, ir.span.end_col],
            "params": list(ir.params), "results": list(ir.results), "guards": list(ir.guards),
            "block_var": ir.block_var, "returns_value": ir.returns_value, "coalesce_var": ir.coalesce_var,
            "coalesce_untiled": list(ir.coalesce_untiled), "coalesce_dim": ir.coalesce_dim,
            "accesses": [[a.param, a.mode, a.line, a.atomic] for a in ir.accesses],
            "run": compiled.factory.code, "run_names": list(compiled.factory.names), "ops": dict(compiled.ops),
            "accesses_fn": artifact.factory.code, "accesses_names": list(artifact.factory.names),
            "source": compiled.source}


def _artifact(d: dict, env: Env, module_globals: dict) -> KernelArtifact:
    ir = KernelIR(name=d["name"], display=d["display"], file=d["file"], span=Span(*d["span"]),
                  params=d["params"], body=[], env=env, anchor=None, block_var=d["block_var"],
                  results=d["results"], guards=d["guards"], returns_value=d["returns_value"],
                  accesses=[ParamAccess(p, m, line=line, atomic=atomic) for p, m, line, atomic in d["accesses"]],
                  coalesce_var=d["coalesce_var"], coalesce_untiled=tuple(d["coalesce_untiled"]),
                  coalesce_dim=d["coalesce_dim"])
    values = {**RUNTIME_NAMES, **{local: OPS[qual] for local, qual in d["ops"].items()}, **env.closure}
    run_factory = Factory(d["run"], tuple(d["run_names"]))
    (run,) = run_factory.instantiate(values, module_globals)
    accesses_factory = Factory(d["accesses_fn"], tuple(d["accesses_names"]))
    (accesses,) = accesses_factory.instantiate(env.closure, module_globals)
    compiled = GeneratedKernel(ir, run, d["source"], "torch", run_factory, d["ops"])
    return KernelArtifact(compiled, accesses, factory=accesses_factory)


# the compiled tier keeps inductor's caches beside ours (replay may not import the disk cache)
tier.cache_folder = functools.partial(disk_cache.private_subfolder, "inductor")
