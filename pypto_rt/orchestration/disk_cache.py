"""The on-disk cache of compiled host programs: a warm start skips parsing, analysis and code generation.

Key: the function's own compiled bytecode (it changes with any edit of its source, line numbers
included), its file and qualified name, the knobs that change generated code, the Python version and
the compiler's own sources (sizes and modification times). An entry holds the marshalled code object
of every generated factory and the plain data the runtime reads (names, spans, parameters, access
modes). Anything unreadable or stale is a miss, never an error. PYPTO_CACHE_DIR=off disables it.

Entries are code this process executes, so whoever can write them can run code as the user. Trust rule (as
OpenSSH's StrictModes): the folder is used only if, opened, it is owned by the user and not writable by group or
others (else one warning, and the run goes on without the cache); every access goes through that open
descriptor, so a path swapped afterwards cannot redirect it. Folders the cache creates are 0700, entries 0600,
written to a new temporary file (O_CREAT|O_EXCL|O_NOFOLLOW) then renamed into place; an entry is read without
following a symlink and only if it is a regular file owned by the user and not writable by others.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import secrets
import stat
import sys
import warnings

from pypto_rt import config
from pypto_rt.errors import Span, user_span
from pypto_rt.frontend.notes import StyleNote
from pypto_rt.frontend.resolve import Env
from pypto_rt.incore_compiler.accesses import ParamAccess
from pypto_rt.incore_compiler.compiler import KernelArtifact
from pypto_rt.incore_compiler.kernel_ir import UNBOUND, GeneratedKernel, KernelIR
from pypto_rt.incore_compiler.pycode import Factory
from pypto_rt.incore_compiler.torch_backend import RUNTIME_NAMES
from pypto_rt.language import _runtime
from pypto_rt.ops import OPS

_FORMAT = 6   # 2: kernels record the inputs a coalesced loop merges only at extent 1; 3 (host `__key`) retired;
              # 5: accesses say which are atomic adds; 6: entries carry their compile's style warnings
_COMPILER_PACKAGES = ("frontend", "incore_compiler", "orchestration")
_compiler_stamp: str | None = None
_warned: set[str] = set()   # folders this process has warned about (once each)


class CacheWarning(UserWarning):
    """The disk cache of compiled programs is not used (an unsafe folder) or an entry was ignored."""


def folder() -> str | None:
    """Where entries live, or None when the cache is off (or a debugging knob needs the full IR)."""
    chosen = config.CACHE_DIR.get()
    if chosen == "off" or config.CHECK.get() or config.DUMP_DIR.get():
        return None
    return chosen or os.path.join(os.path.expanduser("~"), ".cache", "pypto-rt")


def load(kernel, make_program):
    """The cached program of `kernel`, rebuilt with `make_program(kernels, host_factory, host_source, notes)`."""
    where, name = _place(kernel)
    folder_fd = _open_folder(where, create=False)
    if folder_fd is None:
        return None
    try:
        entry = _read_entry(where, folder_fd, name)
        if entry is None or entry.get("format") != _FORMAT:
            return None
        env = Env(kernel.fn)
        module_globals = kernel.fn.__globals__
        kernels = [_artifact(k, env, module_globals) for k in entry["kernels"]]
        host = Factory(entry["host"], tuple(entry["host_names"]))
        notes = tuple(StyleNote(*n) for n in entry["notes"])   # its compile's style warnings, given again
        return make_program(kernels, host, entry["source"], notes)
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss
        return None
    finally:
        os.close(folder_fd)


def store(kernel, program) -> None:
    where, name = _place(kernel)
    entry = {"format": _FORMAT, "host": program.factory.code, "host_names": list(program.factory.names),
             "source": program.source, "kernels": [_describe(a) for a in program.kernels],
             "notes": [[n.message, n.file, n.line] for n in program.notes]}
    folder_fd = _open_folder(where, create=True)
    if folder_fd is None:
        return
    partial = _temp_name(name)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder_fd)
    except FileExistsError:
        _warn(where, f"not writing an entry: something is already at {os.path.join(where, partial)}")
        os.close(folder_fd)
        return
    except OSError:
        os.close(folder_fd)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            marshal.dump(entry, f)
        # atomic: concurrent ranks or runs never read half an entry; replaces a symlink, never follows it
        os.replace(partial, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except (OSError, ValueError):
        _unlink_quietly(partial, folder_fd)
    finally:
        os.close(folder_fd)


def _place(kernel) -> tuple[str | None, str]:
    """(the cache folder or None when off, the entry's file name in it)."""
    fn = kernel.fn
    key = hashlib.sha256()
    for part in (marshal.dumps(fn.__code__), fn.__code__.co_filename, kernel.name, sys.version,
                 config.COALESCE.get(), _stamp()):
        key.update(part if isinstance(part, bytes) else str(part).encode())
    return folder(), key.hexdigest()[:32] + ".bin"


def _temp_name(name: str) -> str:
    return f"{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _open_folder(where: str | None, create: bool) -> int | None:
    """A descriptor of the cache folder if it may be trusted (see the module docstring), else None."""
    if where is None:
        return None
    try:
        if create:
            _make_private_folders(where)
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    problem = _untrusted(st, "folder")
    if problem is None:
        return fd
    os.close(fd)
    _warn(where, f"the folder {problem}, so the disk cache is not used (another user could plant code the next "
                 f"run executes); make it yours and private (chown, chmod 700) or set PYPTO_CACHE_DIR to a folder "
                 f"of your own ('off' disables the cache)")
    return None


def _make_private_folders(where: str) -> None:
    """Create `where` and its missing parents, each 0700 (as XDG asks of a cache home)."""
    missing = []
    path = os.path.abspath(where)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def _read_entry(where: str, folder_fd: int, name: str) -> dict | None:
    """The unmarshalled entry, or None: missing, a symlink, not a regular file, not the user's, or writable by
    others (O_NONBLOCK: a FIFO planted there is refused instead of blocking the open)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn(where, f"ignoring entry {name}: {e.strerror} (a symlink is never followed)")
        return None
    with os.fdopen(fd, "rb") as f:
        problem = _untrusted(os.fstat(f.fileno()), "entry")
        if problem is not None:
            _warn(where, f"ignoring entry {name}: it {problem}; the program is compiled again")
            return None
        return marshal.load(f)


def _untrusted(st: os.stat_result, what: str) -> str | None:
    """Why a folder or entry with this status must not be trusted, or None."""
    kind = stat.S_ISDIR if what == "folder" else stat.S_ISREG
    if not kind(st.st_mode):
        return "is not a regular file" if what == "entry" else "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _warn(where: str, why: str) -> None:
    """One warning per folder and process, at the user's line that led here."""
    if where in _warned:
        return
    _warned.add(where)
    message, span = f"pypto-rt disk cache {where}: {why}", user_span()
    if span is None:
        warnings.warn(message, CacheWarning, stacklevel=2)
    else:
        warnings.warn_explicit(message, CacheWarning, span.file, span.line)


def _unlink_quietly(name: str, folder_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except OSError:
        pass


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


def host_values(kernels, env: Env) -> dict:
    """What a host program's factory is instantiated with."""
    return {"__host": _runtime.current, "__UNBOUND": UNBOUND, "__K": kernels, **env.closure}
