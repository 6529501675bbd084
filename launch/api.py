"""Launching as a function: `launch(program, *args, nproc=...)` or `run(LaunchConfig)` -> `JobResult`.

The Python face of `pypto-launch` (as torchrun's `elastic_launch` is of `torchrun`): the same job, the same exit
codes, but the outcome comes back as data instead of stderr. A call runs one whole job and returns when every rank
has ended. From the main thread the launcher's Ctrl-C/SIGTERM handling is in force meanwhile (the ranks are
ended, the call returns exit code 130/143); from another thread, where Python allows no signal handlers, the job
runs the same but a signal to the process is the caller's to handle (`signals.SignalWatch` is inert). Nothing
is printed but the ranks' own output (to the terminal, or only to `log_dir`); the failure summary the CLI prints
is `JobResult.report`. Unlike the CLI, nothing is read from PYPTO_* variables: arguments say it all.
"""
from __future__ import annotations

import dataclasses
import os
import secrets

from pypto_rt.launch.config import (BACKENDS, COMMS, JOB_ID, PLACEMENTS, LaunchConfig, missing_comm_library,
                                    parse_resources, ray_problem)
from pypto_rt.launch.result import JobResult


class ConfigError(ValueError):
    """A launch argument that cannot work; the message names the argument and what to do."""


def launch(program: str, *args, nproc: int = 1, module: bool = False, log_dir: str | None = None,
           tee: bool = False, comm: str | None = None, timeout_s: float | None = None, job_id: str | None = None,
           nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int | None = None,
           secret: str | None = None, backend: str = "local", address: str | None = None, placement: str = "pack",
           rank_resources: dict | str | None = None) -> JobResult:
    """Run `program` (a file, or a module name with `module=True`) as `nproc` ranks on this host (or, with
    `backend="ray"`, on a Ray cluster); return the job's `JobResult` once every rank has ended.

    `args` are the program's own arguments (str() of each). The keywords are `pypto-launch`'s flags (see
    `LaunchConfig`): `comm` defaults to "shm" on one host and "gloo" across hosts; `job_id` to a random one;
    `secret` (the store's, the same on every node of a multi-host job) to a random one on one host. Raises
    `ConfigError` for arguments that cannot work, before any rank starts. Ray: `address` ("auto", "HOST:PORT";
    None starts a Ray instance for the job, and a Ray session this process already holds is used as it is),
    `placement` "pack" | "spread", `rank_resources` each rank's bundle ({"CPU": 1, "GPU": 1} or "CPU=1,GPU=1";
    default CPU=1).
    """
    try:
        resources = _resources(rank_resources)
    except ValueError as e:
        raise ConfigError(f"rank_resources: {e}") from None
    cfg = LaunchConfig(target=os.fspath(program), args=tuple(str(a) for a in args), module=module, nproc=nproc,
                       nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port,
                       log_dir=os.fspath(log_dir) if log_dir is not None else None, tee=tee,
                       comm=comm or ("shm" if nnodes == 1 else "gloo"), timeout_s=timeout_s, job_id=job_id or "",
                       secret=secret or "", backend=backend, address=address, placement=placement,
                       rank_resources=resources)
    return run(cfg)


def _resources(given: dict | str | None) -> tuple[tuple[str, float], ...]:
    if given is None:
        return (("CPU", 1.0),)
    if isinstance(given, str):
        return parse_resources(given)
    return parse_resources(",".join(f"{k}={v}" for k, v in dict(given).items()))


def run(config: LaunchConfig) -> JobResult:
    """Run the job `config` describes to its end; returns its `JobResult` (exit code as the CLI's, each rank's end,
    the root cause). An empty `job_id` or (on one host) `secret` gets a random one. Raises `ConfigError` before
    any rank starts when the configuration cannot work."""
    cfg = dataclasses.replace(config, job_id=config.job_id or secrets.token_hex(6),
                              secret=config.secret or (secrets.token_hex(16) if config.nnodes == 1 else ""))
    problem = config_problem(cfg)
    if problem:
        raise ConfigError(problem)
    if cfg.backend == "ray":
        from pypto_rt.launch.ray_backend import run_ray_job   # imports ray only now
        return run_ray_job(cfg)
    from pypto_rt.launch.job import run_job   # the job's modules, only when a job runs
    return run_job(cfg)


def config_problem(cfg: LaunchConfig) -> str | None:
    """Why `cfg` cannot work, in one sentence naming the `launch` argument, or None."""
    for name in ("nproc", "nnodes"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            return f"{name} must be an integer >= 1, got {getattr(cfg, name)!r}"
    if not isinstance(cfg.node_rank, int) or not 0 <= cfg.node_rank < cfg.nnodes:
        return f"node_rank must be 0 .. nnodes-1 = {cfg.nnodes - 1}, got {cfg.node_rank!r}"
    if cfg.master_port is not None and not (isinstance(cfg.master_port, int) and 0 <= cfg.master_port <= 65535):
        return f"master_port must be an integer between 0 and 65535, got {cfg.master_port!r}"
    if cfg.node_rank > 0 and not cfg.master_port:
        return f"node_rank {cfg.node_rank} needs master_port: the port node 0's launcher printed or was given"
    if cfg.nnodes > 1 and not cfg.secret:
        return (f"nnodes {cfg.nnodes} needs secret, the same on every node: the job's store admits only its "
                "holders (e.g. secrets.token_hex(16), shared with the other nodes)")
    if cfg.comm not in COMMS:
        return f"comm must be one of {', '.join(COMMS)}, got {cfg.comm!r}"
    if cfg.comm == "shm" and cfg.nnodes > 1:
        return f"comm 'shm' works within one host only; use comm='gloo' for nnodes {cfg.nnodes}"
    if cfg.backend not in BACKENDS:
        return f"backend must be one of {', '.join(BACKENDS)}, got {cfg.backend!r}"
    if cfg.backend == "ray":
        problem = ray_problem(cfg.nnodes) or (None if cfg.placement in PLACEMENTS else
                                              f"placement must be one of {', '.join(PLACEMENTS)}, got {cfg.placement!r}")
        if problem:
            return f"backend 'ray': {problem}"
    if cfg.timeout_s is not None and not (isinstance(cfg.timeout_s, (int, float)) and cfg.timeout_s > 0):
        return f"timeout_s must be a positive number of seconds or None, got {cfg.timeout_s!r}"
    if not JOB_ID.fullmatch(cfg.job_id):
        return f"job_id may hold only letters, digits, '_', '.', '-' (at most 64), got {cfg.job_id!r}"
    if not cfg.module and not os.path.isfile(cfg.target):
        return f"no such file: {cfg.target} (to run a module, pass module=True)"
    problem = missing_comm_library(cfg.comm)
    return f"comm {cfg.comm!r}: {problem}; use comm='gloo' (CPU, any host) or 'shm' (one host)" if problem else None
