"""`python -m pypto_rt.launch.rank_main (prog.py | -m module) args...`: one rank of a pypto-launch job.

The program runs as `__main__` exactly as under pypto-run (its folder and the kernel library root on sys.path,
`golden` importable; torch is imported only if the program uses it). When it fails (an uncaught exception, or
SystemExit with a non-zero code) the rank prints the error as pypto-run does and writes its error record, JSON,
to $PYPTO_ERROR_FILE (atomically: the launcher never reads half a file):

    rank, local_rank, pid    who failed
    time                     wall clock (time.time()) when the error reached the top of the program
    exit_code                the rank's exit code
    error_type               the exception's class ("SystemExit" for a bare non-zero exit)
    message                  the error as pypto-run prints it: user frames only, file:line
    where                    "file:line:col" of the innermost user frame, or null
    wait                     the communicator's wait report ({rank, op, label, window, cell, seen, expected,
                             cmp, peers, waited_s}) of the first exception in the chain carrying `.wait`
                             (following `.error`, `__cause__` and `__context__`), or null
    peer_caused              true when the chain holds a PeerAbortedError (known by its class name, so ranks
                             need not import the communicator): by its own account, another rank's abort, death
                             or exit ended this one, so it is not the root cause while another failure exists

On SIGUSR1 the rank writes every thread's stack to $PYPTO_STACK_FILE (faulthandler, from the signal handler, so
even a rank stuck in C code answers); the launcher asks the ranks still running when another one failed.

Imports nothing heavy: a rank that does not use torch never loads it.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import runpy
import sys
import time

from pypto_rt import knobs
from pypto_rt.errors import error_chain, find_wait
from pypto_rt.launch import files
from pypto_rt.pypto_run import format_user_error, prepare

USAGE = "usage: python -m pypto_rt.launch.rank_main (prog.py | -m module) [args...]   (started by pypto-launch)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    module = argv[:1] == ["-m"]
    argv = argv[1:] if module else argv
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    target, args = argv[0], argv[1:]
    _arm_stack_dump()
    if not module:
        # as under `python prog.py`: the program's folder is importable, the launcher's working directory is not
        if sys.path and sys.path[0] in ("", os.getcwd()):
            del sys.path[0]
        if not os.path.isfile(target):
            return _fail(2, "FileNotFoundError", f"pypto-launch: no such file: {target}")
    problem = prepare(target, args, folder=os.getcwd() if module else None, lazy_golden=True)
    if problem:
        return _fail(2, "EnvironmentError", problem)
    return _run(target, module)


def _arm_stack_dump() -> None:
    """faulthandler writes every thread's stack to $PYPTO_STACK_FILE on SIGUSR1 (the file stays open)."""
    path = knobs.STACK_FILE.raw()
    if not path:
        return
    try:
        out = files.create(path, "w")
    except OSError as e:
        print(f"pypto-launch: rank cannot write its stack file {path}: {e}", file=sys.stderr)
        return
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
    _STACK_OUT.append(out)


_STACK_OUT: list = []   # keeps the stack file open as long as the process lives


def _run(target: str, module: bool) -> int:
    return _end_communication(_run_program(target, module))


def _end_communication(code: int) -> int:
    """The program's communicator, if it made one: an exit barrier after success (a peer may still read this
    rank's windows), an abort after a failure (peers waiting on this rank fail at once instead of timing out)."""
    process = sys.modules.get("pypto_rt.collective.process")
    if process is None:
        return code
    try:
        if code == 0:
            process.close()
        else:
            process.abort(f"rank {_env_int(knobs.RANK)} failed (exit code {code})")
    except BaseException as e:  # noqa: BLE001 - the exit barrier failing is this rank's failure too
        return _fail(1, _type_name(e), format_user_error(e), exc=e, when=time.time())
    return code


def _run_program(target: str, module: bool) -> int:
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code, text = _exit_code(e.code)
        if code == 0:
            return 0
        # a bare non-zero exit prints nothing here (the launcher says it); a text exit prints its text
        return _fail(code, "SystemExit", text or f"rank {_env_int(knobs.RANK)} exited with code {e.code}",
                     quiet=text is None)
    except KeyboardInterrupt:
        return _fail(130, "KeyboardInterrupt", f"rank {_env_int(knobs.RANK)} was interrupted (SIGINT)")
    except BaseException as e:  # noqa: BLE001 - any failure of the user's program is this rank's failure
        when = time.time()
        _drop_own_frames(e)
        return _fail(1, _type_name(e), format_user_error(e), exc=e, when=when)
    return 0


def _fail(code: int, error_type: str, message: str, exc: BaseException | None = None, when: float | None = None,
          quiet: bool = False) -> int:
    """Print the error to stderr (unless `quiet`) and write the error record."""
    if not quiet:
        print(message, file=sys.stderr)
    path = knobs.ERROR_FILE.raw()
    if path:
        record = {"rank": _env_int(knobs.RANK), "local_rank": _env_int(knobs.LOCAL_RANK), "pid": os.getpid(),
                  "time": when or time.time(), "exit_code": code, "error_type": error_type, "message": message,
                  "where": _where(exc), "wait": find_wait(exc), "peer_caused": _peer_caused(exc)}
        try:
            _write_json(path, record)
        except OSError as e:
            print(f"pypto-launch: rank could not write its error file {path}: {e}", file=sys.stderr)
    return code


def _peer_caused(exc: BaseException | None) -> bool:
    """Whether `exc`'s chain holds a PeerAbortedError (by name: a rank need not have imported torch)."""
    return any(any(cls.__name__ == "PeerAbortedError" for cls in type(e).__mro__) for e in error_chain(exc))


def _exit_code(code) -> tuple[int, str | None]:
    """SystemExit's code as an exit status (0-255) and the text to report, if it was not a number."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return (code if 0 <= code <= 255 else 1), None
    return 1, str(code)


def _drop_own_frames(e: BaseException) -> None:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    e.__traceback__ = tb


def _where(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    from pypto_rt.errors import span_from_traceback
    span = getattr(exc, "span", None) or span_from_traceback(exc.__traceback__)
    return str(span) if span is not None else None


def _type_name(e: BaseException) -> str:
    cls = type(e)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _env_int(knob: knobs.Knob) -> int:
    """A contract integer for an error record, which must be written even when the variable is malformed."""
    try:
        return int(knob.raw() or 0)
    except ValueError:
        return 0


def _write_json(path: str, record: dict) -> None:
    tmp = f"{path}.tmp"
    with files.create(tmp, "w") as f:
        json.dump(record, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    raise SystemExit(main())
