"""`pypto-launch [flags] prog.py args...` (or `-m module args...`): flags -> a validated `LaunchConfig` -> a job.

Every flag falls back to a `PYPTO_*` environment variable (the flag wins); kebab-case and snake_case spellings
are both accepted, as torchrun does. A thin wrapper over `api.run`: it prints the job's report and exits with its
code (0 all ranks passed, 1 a rank failed, 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP), 2 for a usage error.
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys

from pypto_rt import knobs
from pypto_rt.errors import PyptoError
from pypto_rt.launch.config import (BACKENDS, COMMS, JOB_ID, LaunchConfig, missing_comm_library, ray_problem,
                                    parse_resources)

PROG = "pypto-launch"

# flag -> its environment fallback (declared, with the flag's help, in pypto_rt.knobs); defaults and checks live
# in `_config`, so the launcher reads the raw strings and says which flag or variable is wrong
_FLAGS = {
    "nproc": knobs.NPROC, "nnodes": knobs.NNODES, "node-rank": knobs.NODE_RANK, "master-addr": knobs.MASTER_ADDR_FLAG,
    "master-port": knobs.MASTER_PORT_FLAG, "log-dir": knobs.LOG_DIR, "comm": knobs.COMM,
    "backend": knobs.LAUNCH_BACKEND, "timeout-s": knobs.TIMEOUT_S, "job-id": knobs.JOB_ID,
    "address": knobs.RAY_ADDRESS, "placement": knobs.PLACEMENT, "rank-resources": knobs.RANK_RESOURCES,
}
_HELP = {"timeout-s": "seconds without progress before a rank stops with a stall report"}
_TEE_ENV = knobs.TEE.env
_SECRET_ENV = knobs.JOB_SECRET.env  # environment only: a command line is readable by every user in /proc
# every variable the CLI reads (a caller that wants none of them in force clears these)
ENVIRONMENT = tuple(knob.env for knob in _FLAGS.values()) + (_TEE_ENV, _SECRET_ENV)


class UsageError(Exception):
    """A flag or environment value that cannot work; the message says which and what to do."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Start N ranks of a Python program, end them all when one fails, and report which failed first.",
        epilog="Each flag can also be set by the environment variable named in its help; the flag wins.")
    for flag, knob in _FLAGS.items():
        names = [f"--{flag}"] + ([f"--{flag.replace('-', '_')}"] if "-" in flag else [])
        p.add_argument(*names, dest=flag.replace("-", "_"), default=None, metavar=flag.split("-")[-1].upper(),
                       help=f"{_HELP.get(flag, knob.doc)} [{knob.env}]")
    p.add_argument("--tee", action="store_true", default=None,
                   help=f"with --log-dir, also echo rank output to the terminal as [rank N] lines [{_TEE_ENV}=1]")
    p.add_argument("-m", "--module", action="store_true", help="run the target as a module, as `python -m` does")
    p.add_argument("target", nargs="?", help="the program file (or module name with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the program's own arguments")
    return p


def _pick(ns: argparse.Namespace, flag: str) -> tuple[str | None, str]:
    """The raw value of a flag (or its environment fallback) and how to name its source in an error."""
    value = getattr(ns, flag.replace("-", "_"))
    if value is not None:
        return value, f"--{flag}"
    knob = _FLAGS[flag]
    return knob.given() or None, knob.env


def _env_flag(knob: knobs.Knob) -> bool:
    try:
        return knob.on()
    except PyptoError as e:
        raise UsageError(e.message) from None


def _int(ns, flag: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
    raw, source = _pick(ns, flag)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise UsageError(f"{source} must be an integer {bound}, got {raw!r}")
    return value


def _config(ns: argparse.Namespace) -> LaunchConfig:
    if not ns.target:
        raise UsageError("no program given; usage: pypto-launch --nproc N prog.py [args...]  (or -m module)")
    nproc = _int(ns, "nproc", 1, 1)
    nnodes = _int(ns, "nnodes", 1, 1)
    node_rank = _int(ns, "node-rank", 0, 0)
    if node_rank >= nnodes:
        raise UsageError(f"--node-rank {node_rank} is not below --nnodes {nnodes}; number the hosts 0 .. {nnodes - 1}")
    master_port = _int(ns, "master-port", None, 0, 65535)
    if node_rank > 0 and not master_port:
        raise UsageError(f"--node-rank {node_rank} needs --master-port: the port node 0's launcher printed or was "
                         "given")
    comm, source = _pick(ns, "comm")
    comm = comm or ("shm" if nnodes == 1 else "gloo")
    if comm not in COMMS:
        raise UsageError(f"{source} must be one of {', '.join(COMMS)}, got {comm!r}")
    if comm == "shm" and nnodes > 1:
        raise UsageError(f"--comm shm works within one host only; use --comm gloo for --nnodes {nnodes}")
    backend, source = _pick(ns, "backend")
    backend = backend or "local"
    if backend not in BACKENDS:
        raise UsageError(f"{source} must be one of {', '.join(BACKENDS)}, got {backend!r}")
    ray_settings = _ray_settings(ns, backend, nnodes)
    master_addr, secret = _store_settings(ns, nnodes)
    timeout_s = None
    raw, source = _pick(ns, "timeout-s")
    if raw is not None:
        try:
            timeout_s = float(raw)
        except ValueError:
            timeout_s = -1.0
        if not timeout_s > 0:
            raise UsageError(f"{source} must be a positive number of seconds, got {raw!r}")
    job_id, source = _pick(ns, "job-id")
    job_id = job_id or secrets.token_hex(6)
    if not JOB_ID.fullmatch(job_id):
        raise UsageError(f"{source} may hold only letters, digits, '_', '.', '-' (at most 64), got {job_id!r}")
    tee = bool(ns.tee) or _env_flag(knobs.TEE)
    log_dir, _ = _pick(ns, "log-dir")
    if not ns.module and not os.path.isfile(ns.target):
        raise UsageError(f"no such file: {ns.target} (to run a module, use -m {ns.target})")
    return LaunchConfig(target=ns.target, args=tuple(ns.args), module=ns.module, nproc=nproc, nnodes=nnodes,
                        node_rank=node_rank, master_addr=master_addr or "127.0.0.1", master_port=master_port,
                        log_dir=log_dir, tee=tee, comm=comm, backend=backend, timeout_s=timeout_s, job_id=job_id,
                        secret=secret or secrets.token_hex(16), **ray_settings)


def _ray_settings(ns: argparse.Namespace, backend: str, nnodes: int) -> dict:
    """--address, --placement, --rank-resources (with --backend ray only); UsageError saying what to do."""
    given = {flag: _pick(ns, flag) for flag in ("address", "placement", "rank-resources")}
    if backend != "ray":
        stray = [source for value, source in given.values() if value is not None and source.startswith("--")]
        if stray:
            raise UsageError(f"{stray[0]} applies to --backend ray only")
        return {}
    problem = ray_problem(nnodes)
    if problem:
        raise UsageError(f"--backend ray: {problem}")
    (address, _), (placement, source) = given["address"], given["placement"]
    placement = placement or "pack"
    if placement not in ("pack", "spread"):
        raise UsageError(f"{source} must be pack or spread, got {placement!r}")
    raw, source = given["rank-resources"]
    try:
        resources = parse_resources(raw) if raw is not None else (("CPU", 1.0),)
    except ValueError as e:
        raise UsageError(f"{source}: {e}") from None
    return {"address": address, "placement": placement, "rank_resources": resources}


def _store_settings(ns: argparse.Namespace, nnodes: int) -> tuple[str | None, str]:
    """--master-addr and the job's store secret (PYPTO_JOB_SECRET, never a flag: argv is public in /proc)."""
    master_addr, _ = _pick(ns, "master-addr")
    secret = knobs.JOB_SECRET.raw()
    if nnodes > 1 and not master_addr:
        raise UsageError(f"--nnodes {nnodes} needs --master-addr: node 0's address that the other nodes reach (the "
                         "store listens there only)")
    if nnodes > 1 and not secret:
        raise UsageError(f"--nnodes {nnodes} needs {_SECRET_ENV} in the environment, the same on every node: the "
                         "job's store admits only its holders (e.g. export "
                         f"{_SECRET_ENV}=$(python3 -c 'import secrets; print(secrets.token_hex(16))'))")
    return master_addr, secret


def parse(argv: list[str]) -> LaunchConfig:
    """The LaunchConfig for a command line (and the environment); raises UsageError."""
    return _config(_parser().parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    """Console entry of `pypto-launch`; returns the exit code."""
    try:
        try:
            cfg = parse(list(sys.argv[1:] if argv is None else argv))
        except UsageError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2
        problem = missing_comm_library(cfg.comm)
        if problem:
            print(f"{PROG}: --comm {cfg.comm}: {problem}; use --comm gloo (CPU, any host) or shm (one host)",
                  file=sys.stderr)
            return 2
        from pypto_rt.launch.api import run
        result = run(cfg)
        if result.report:
            print(result.report, file=sys.stderr)
        return result.exit_code
    except KeyboardInterrupt:  # only before the job installs its own handlers; it cleans up after itself
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
