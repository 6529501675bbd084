"""`pypto-run FILE.py [args...]`: run a PyPTO kernel file unmodified on the CPU.

The file runs as `__main__` with its own folder and the kernel library's root (the nearest
parent holding `models/` or `examples/`) on sys.path, and pypto-rt's harness importable as
`golden`. NPU platforms (`-p a2a3`, the library default) run on the CPU with a one-line
notice. Exit codes: 0 pass, 1 mismatch or error, 2 usage.
"""
from __future__ import annotations

import gc
import os
import runpy
import sys
import traceback

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
    # Idle OpenMP threads of the host's own torch ops otherwise spin and starve the runtime's workers (measured:
    # a 2-thread GEMM on the host slowed a 1-worker run from 30 to 66-75 ms); read when torch loads, below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    problem = _check_pypto_is_ours()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import pypto_rt.golden as golden
    sys.modules["golden"] = golden
    os.environ["PYPTO_RUN_CPU_FALLBACK"] = "1"
    folder = os.path.dirname(os.path.abspath(path))
    root = _library_root(folder)
    sys.path[:0] = [p for p in (folder, root) if p and p not in sys.path[:2]]
    sys.argv = [path, *argv[1:]]
    # torch and pypto-rt are loaded: later full collections need not rescan their ~10^5 long-lived objects
    # (each such collection paused a run for ~80 ms on this machine)
    gc.freeze()
    return _run(path)


def _run(path: str) -> int:
    from pypto_rt.errors import PyptoError, strip_internal_frames
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except PyptoError as e:
        _print_user_traceback(e, strip_internal_frames(e.__traceback__))
        return 1
    except KeyboardInterrupt:
        print("pypto-run: interrupted", file=sys.stderr)
        return 130
    except BaseException as e:  # noqa: BLE001 - report any failure of the user's file, exit 1
        tb = strip_internal_frames(e.__traceback__)
        traceback.print_exception(type(e), e, tb, file=sys.stderr)
        return 1
    return 0


def _print_user_traceback(err, tb) -> None:
    frames = traceback.extract_tb(tb)
    frames = [f for f in frames if not f.filename.endswith("runpy.py")]
    if len(frames) > 1:
        print("Traceback (user frames only):", file=sys.stderr)
        print("".join(traceback.format_list(frames[:-1])).rstrip(), file=sys.stderr)
    print(err.render(), file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
