"""pypto-launch: starts the ranks of a multi-rank program and reports failures; installed as pypto_rt.launch.

From Python, `launch(program, *args, nproc=N, ...)` (or `run(LaunchConfig(...))`) runs one job and returns its
`JobResult`: the exit code `pypto-launch` would give, each rank's end (`RankExit`: exit code or signal, whether
it is the root cause, its error and log) and `root_cause`, the rank the failure report names first:

    from pypto_rt.launch import launch
    result = launch("train.py", "--steps", 10, nproc=4, log_dir="logs")
    if not result.passed:
        print(result.root_cause.rank, result.root_cause.error)

`run_function(fn, *args, nproc=N, backend="local"|"ray")` calls a function on N ranks and returns each rank's
return value (or raises `JobFailed` naming the root cause). `backend="ray"` runs the ranks as Ray actors.

Modules, one job each: `api` (`launch`, `run`), `functions` (`run_function`; its ranks run `function_main`),
`ray_backend` (a job on Ray: layout, store, report), `ray_cluster` (connect, placement group, actors),
`ray_supervisor` (the driver's watch over the actors), `ray_rank` (the actor: one rank process), `cli` (flags and PYPTO_* variables -> `LaunchConfig`, then
`api.run`), `config` (that dataclass), `result` (`JobResult`), `contract` (the environment every rank gets), `job`
(one job: store, ranks, report, cleanup), `job_store` (the TCPStore node 0 hosts), `gateway` (authenticated
store connections between hosts), `supervisor` (rank processes: start, watch, end), `output` (rank output to
logs and terminal), `signals` (Ctrl-C/SIGTERM to the launcher), `report` (first failure and the summary), `job_segments`
(the job's /dev/shm segments), `files` (the log folder's checks and link-proof opens), `rank_main` (the entry
each rank runs). Importing this package is cheap: ranks import it, and must not pay for torch.
"""
from pypto_rt.launch.api import ConfigError, launch, run
from pypto_rt.launch.config import LaunchConfig
from pypto_rt.launch.functions import run_function
from pypto_rt.launch.result import JobFailed, JobResult, RankExit

__all__ = ["ConfigError", "JobFailed", "JobResult", "LaunchConfig", "RankExit", "launch", "run", "run_function"]
