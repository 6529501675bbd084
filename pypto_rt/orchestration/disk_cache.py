"""The on-disk cache of compiled host programs: a warm start skips parsing, analysis and code generation.

Key: the function's own compiled bytecode (it changes with any edit of its source, line numbers
included), its file and qualified name, the knobs that change generated code, the Python version and
the compiler's own sources (sizes and modification times). An entry holds the marshalled code object
of every generated factory and the plain data the runtime reads (names, spans, parameters, access
modes). Anything unreadable or stale is a miss, never an error. PYPTO_CACHE_DIR=off disables it.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import sys

from pypto_rt import config
from pypto_rt.errors import Span
from pypto_rt.frontend.notes import StyleNote
from pypto_rt.frontend.resolve import Env
from pypto_rt.incore_compiler.accesses import Access
from pypto_rt.incore_compiler.compiler import KernelArtifact
from pypto_rt.incore_compiler.kernel_ir import UNBOUND, CompiledKernel, KernelIR
from pypto_rt.incore_compiler.pycode import Factory
from pypto_rt.incore_compiler.torch_backend import RUNTIME_NAMES
from pypto_rt.language import _runtime
from pypto_rt.ops import OPS

_FORMAT = 4   # 2: kernels record the inputs a coalesced loop merges only at extent 1; 3 (host `__key`) retired
_COMPILER_PACKAGES = ("frontend", "incore_compiler", "orchestration")
_compiler_stamp: str | None = None


def folder() -> str | None:
    """Where entries live, or None when the cache is off (or a debugging knob needs the full IR)."""
    chosen = config.CACHE_DIR.get()
    if chosen == "off" or config.CHECK.get() or config.DUMP_DIR.get():
        return None
    return chosen or os.path.join(os.path.expanduser("~"), ".cache", "pypto-rt")


def load(kernel, make_program):
    """The cached program of `kernel`, rebuilt with `make_program(kernels, host_factory, host_source, notes)`."""
    path = _path(kernel)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            entry = marshal.load(f)
        if entry.get("format") != _FORMAT:
            return None
        env = Env(kernel.fn)
        module_globals = kernel.fn.__globals__
        kernels = [_artifact(k, env, module_globals) for k in entry["kernels"]]
        host = Factory(entry["host"], tuple(entry["host_names"]))
        notes = tuple(StyleNote(*n) for n in entry["notes"])   # its compile's style warnings, given again
        return make_program(kernels, host, entry["source"], notes)
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss
        return None


def store(kernel, program) -> None:
    path = _path(kernel)
    if path is None:
        return
    entry = {"format": _FORMAT, "host": program.factory.code, "host_names": list(program.factory.names),
             "source": program.source, "kernels": [_describe(a) for a in program.kernels],
             "notes": [[n.message, n.file, n.line] for n in program.notes]}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "wb") as f:
            marshal.dump(entry, f)
        os.replace(partial, path)   # atomic: concurrent ranks or runs never read half an entry
    except OSError:
        pass


def _path(kernel) -> str | None:
    where = folder()
    if where is None:
        return None
    fn = kernel.fn
    key = hashlib.sha256()
    for part in (marshal.dumps(fn.__code__), fn.__code__.co_filename, kernel.name, sys.version,
                 config.COALESCE.get(), _stamp()):
        key.update(part if isinstance(part, bytes) else str(part).encode())
    return os.path.join(where, key.hexdigest()[:32] + ".bin")


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
            "accesses": [[a.param, a.mode, a.line] for a in ir.accesses],
            "run": compiled.factory.code, "run_names": list(compiled.factory.names), "ops": dict(compiled.ops),
            "accesses_fn": artifact.factory.code, "accesses_names": list(artifact.factory.names),
            "source": compiled.source}


def _artifact(d: dict, env: Env, module_globals: dict) -> KernelArtifact:
    ir = KernelIR(name=d["name"], display=d["display"], file=d["file"], span=Span(*d["span"]),
                  params=d["params"], body=[], env=env, anchor=None, block_var=d["block_var"],
                  results=d["results"], guards=d["guards"], returns_value=d["returns_value"],
                  accesses=[Access(p, m, line=line) for p, m, line in d["accesses"]],
                  coalesce_var=d["coalesce_var"], coalesce_untiled=tuple(d["coalesce_untiled"]),
                  coalesce_dim=d["coalesce_dim"])
    values = {**RUNTIME_NAMES, **{local: OPS[qual] for local, qual in d["ops"].items()}, **env.closure}
    run_factory = Factory(d["run"], tuple(d["run_names"]))
    (run,) = run_factory.instantiate(values, module_globals)
    accesses_factory = Factory(d["accesses_fn"], tuple(d["accesses_names"]))
    (accesses,) = accesses_factory.instantiate(env.closure, module_globals)
    compiled = CompiledKernel(ir, run, d["source"], "torch", run_factory, d["ops"])
    return KernelArtifact(compiled, accesses, factory=accesses_factory)


def host_values(kernels, env: Env) -> dict:
    """What a host program's factory is instantiated with."""
    return {"__host": _runtime.current, "__UNBOUND": UNBOUND, "__K": kernels, **env.closure}
