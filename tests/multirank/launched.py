"""Running a program under `pypto-launch` from a test: a fresh job id, the caller's launcher settings cleared,
a bounded time, and a check that the job left none of its `/dev/shm/pypto-<job id>*` segments behind (other jobs
on the machine may create and remove pypto-* segments meanwhile, so only this job's count)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from tests.launch.job_result import Job

LAUNCH = os.path.join(os.path.dirname(sys.executable), "pypto-launch")

# the launcher's own settings from the caller's environment must not change what a test launches
_LAUNCHER_ENV = ("PYPTO_NPROC", "PYPTO_NNODES", "PYPTO_NODE_RANK", "PYPTO_MASTER_ADDR", "PYPTO_MASTER_PORT",
                 "PYPTO_LOG_DIR", "PYPTO_COMM", "PYPTO_LAUNCH_BACKEND", "PYPTO_TIMEOUT_S", "PYPTO_JOB_ID",
                 "PYPTO_LAUNCHED", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYPTO_COMM_CHECK",
                 "PYPTO_NUM_WORKERS")


def segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("pypto-")}
    except FileNotFoundError:
        return set()


def launch(nproc: int, prog: str, *flags: str, args: tuple = (), env: dict | None = None,
           limit_s: float = 120) -> Job:
    """`pypto-launch --nproc N flags... prog args...` with a fresh job id; checks the job left no shared memory."""
    job_id = "mr" + uuid.uuid4().hex[:12]
    full_env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV}
    full_env.update(env or {})
    before = segments()
    start = time.monotonic()
    proc = subprocess.run([LAUNCH, "--nproc", str(nproc), "--job-id", job_id, *flags, prog, *args],
                          capture_output=True, text=True, env=full_env, timeout=limit_s)
    seconds = time.monotonic() - start
    left = sorted(n for n in segments() - before if n.startswith(f"pypto-{job_id}"))
    assert not left, f"job {job_id} left shared memory behind: {left}\n{proc.stderr[-3000:]}"
    return Job(proc.returncode, proc.stdout, proc.stderr, seconds)
