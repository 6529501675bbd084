"""`pypto-run FILE.py [args...]`: run a PyPTO kernel file unmodified on the CPU.

The file runs as `__main__` with its own folder and the kernel library's root (the nearest
parent holding `models/` or `examples/`) on sys.path, and pypto-rt's harness importable as
`golden`. NPU platforms (`-p a2a3`, the library default) run on the CPU with a one-line
notice. Exit codes: 0 pass, 1 mismatch or error, 2 usage, 130 Ctrl-C, 128 + N for SIGTERM/SIGHUP (with one line saying where).
"""
from __future__ import annotations

import gc
import os
import runpy
import signal
import sys
import traceback
import types

from pypto_rt import knobs

USAGE = "usage: pypto-run FILE.py [args...]   (runs a PyPTO kernel file on the CPU; see README)"


def _library_root(folder: str) -> str | None:
    path = os.path.abspath(folder)
    while True:
        if any(os.path.isdir(os.path.join(path, d)) for d in ("models", "examples")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _check_pypto_is_ours() -> str | None:
    import importlib.util
    spec = importlib.util.find_spec("pypto")
    if spec is None:
        return "pypto-run: the `pypto` package is not importable; reinstall pypto-rt (make demo does it)."
    import pypto
    if not getattr(pypto, "__pypto_rt_shim__", False):
        return (f"pypto-run: `import pypto` finds the real PyPTO compiler ({os.path.dirname(spec.origin or '?')}), "
                "which cannot share an environment with pypto-rt; use a separate virtualenv for each.")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    path = argv[0]
    if not os.path.isfile(path):
        print(f"pypto-run: no such file: {path}", file=sys.stderr)
        return 2
    terminated = _on_termination(path)
    for signum in (signal.SIGTERM, signal.SIGHUP):   # from here on, also while torch loads
        if signal.getsignal(signum) is not signal.SIG_IGN:   # under nohup, SIGHUP stays ignored
            signal.signal(signum, terminated)
    try:
        code = _prepare_and_run(path, argv[1:])
    except _Terminated as e:
        # 128 + N, as a shell reports it and pypto-launch exits: a caller tells "terminated" from "failed" (1)
        _say(f"pypto-run: terminated by {signal.Signals(e.signum).name} during {path}{e.where}; exit {e.code}")
        code = e.code
    workers = sys.modules.get("pypto_rt.aicpu.workers")   # loaded only if the file ran the engine
    if workers is not None:
        workers.exiting_with(code)   # kept even if a worker still inside a kernel makes exit end early
    return code


def _prepare_and_run(path: str, args: list[str]) -> int:
    problem = prepare(path, args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    # torch and pypto-rt are loaded: later full collections need not rescan their ~10^5 long-lived objects
    # (each such collection paused a run for ~80 ms on this machine)
    gc.freeze()
    return _run(path)


def prepare(path: str, args: list[str], folder: str | None = None, lazy_golden: bool = False) -> str | None:
    """Set this interpreter up to run `path` as pypto-run does; returns a problem sentence, or None.

    `folder` (default: the file's own) and the library root above it go on sys.path. With `lazy_golden`,
    `golden` (and with it torch) is imported only when the program first uses it (pypto-launch's ranks).
    """
    # Idle OpenMP threads of the host's own torch ops otherwise spin and starve the runtime's workers (measured:
    # a 2-thread GEMM on the host slowed a 1-worker run from 30 to 66-75 ms); read when torch loads, below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    problem = _check_pypto_is_ours()
    if problem:
        return problem
    if lazy_golden:
        sys.modules["golden"] = _LazyGolden("golden")
    else:
        import pypto_rt.golden as golden
        sys.modules["golden"] = golden
    os.environ[knobs.RUN_CPU_FALLBACK.env] = "1"   # for the harness, in this process and its children
    folder = folder or os.path.dirname(os.path.abspath(path))
    root = _library_root(folder)
    sys.path[:0] = [p for p in (folder, root) if p and p not in sys.path[:2]]
    sys.argv = [path, *args]
    return None


class _LazyGolden(types.ModuleType):
    """Stands in for `golden` until first use, then imports pypto_rt.golden and takes its place."""

    def __getattr__(self, name: str):
        import pypto_rt.golden as golden
        sys.modules["golden"] = golden
        return getattr(golden, name)


class _Terminated(SystemExit):
    """SIGTERM or SIGHUP (a closed terminal or ssh session) ends the program like an exit: cleanup (e.g. a
    host-form job's ranks and segments) still runs, and a user's `except Exception` does not catch it. `where` is
    the user's line it arrived at, if any."""

    def __init__(self, signum: int, where: str):
        super().__init__(128 + signum)
        self.signum, self.where = signum, where


def _on_termination(path: str):
    """The SIGTERM/SIGHUP handler of pypto-run: raise _Terminated at the main thread's current line."""
    path = os.path.abspath(path)

    def terminated(signum, frame):
        raise _Terminated(signum, _user_line(frame, path))
    return terminated


def _user_line(frame, path: str) -> str:
    """' (line N, in fn)' for the innermost frame of `path` on `frame`'s stack, or ''."""
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename) == path:
            return f" (line {frame.f_lineno}, in {frame.f_code.co_name})"
        frame = frame.f_back
    return ""


def _run(path: str) -> int:
    try:
        runpy.run_path(path, run_name="__main__")
    except _Terminated:
        raise
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pypto-run: interrupted", file=sys.stderr)
        return 130
    except BaseException as e:  # noqa: BLE001 - report any failure of the user's file, exit 1
        print(format_user_error(e), file=sys.stderr)
        return 1
    return 0


def _say(line: str) -> None:
    """One line on stderr, which may be gone (a hung-up terminal)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def format_user_error(err: BaseException) -> str:
    """The text pypto-run prints for an error of the user's file: user frames only, a PyptoError rendered."""
    from pypto_rt.errors import PyptoError, strip_internal_frames
    tb = strip_internal_frames(err.__traceback__)
    if not isinstance(err, PyptoError):
        return "".join(traceback.format_exception(type(err), err, tb)).rstrip()
    frames = traceback.extract_tb(tb)
    frames = [f for f in frames if not f.filename.endswith("runpy.py")]
    lines = []
    if len(frames) > 1:
        lines.append("Traceback (user frames only):")
        lines.append("".join(traceback.format_list(frames[:-1])).rstrip())
    lines.append(err.render())
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
