"""`pypto_rt.launch.launch` as a Python function: real rank processes, the outcome as a `JobResult`.

Uses only the package's public names (`launch`, `JobResult`, `JobFailed`, `ConfigError`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pypto_rt.launch import ConfigError, JobFailed, launch


@pytest.mark.timeout(60)
def test_a_two_rank_job_that_passes(program, tmp_path):
    prog = program("""
    import os, sys
    open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w").write(" ".join(sys.argv[2:]))
    """)
    result = launch(prog, tmp_path, "x", 7, nproc=2)
    assert (result.exit_code, result.passed, result.root_cause, result.report) == (0, True, None, "")
    assert [(r.rank, r.exit_code, r.signal, r.state, r.error) for r in result.ranks] == [
        (0, 0, None, "passed", ""), (1, 0, None, "passed", "")]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["x 7", "x 7"]
    assert result.check() is result


@pytest.mark.timeout(60)
def test_rank_one_exiting_3_is_the_root_cause(program, tmp_path):
    prog = program("""
    import os, sys, time
    if os.environ["RANK"] == "1":
        print("rank one gives up", file=sys.stderr)
        sys.exit(3)
    time.sleep(60)
    """)
    result = launch(prog, nproc=2, log_dir=tmp_path / "logs", job_id="api-exit3")
    assert (result.exit_code, result.passed, result.job_id) == (1, False, "api-exit3")   # as pypto-launch's
    root = result.root_cause
    assert (root.rank, root.exit_code, root.signal, root.state, root.root_cause) == (1, 3, None, "failed", True)
    assert root.error == root.message == "rank 1 exited with code 3"
    assert root.log == str(tmp_path / "logs" / "rank1.stderr.log")
    assert "rank one gives up" in open(root.log).read()
    rank0 = result.ranks[0]   # the launcher ended the other rank
    assert (rank0.rank, rank0.state, rank0.root_cause, rank0.signal) == (0, "killed", False, signal.SIGTERM)
    assert "rank 1 failed first (exit code 3" in result.report
    with pytest.raises(JobFailed, match="rank 1 failed first") as failed:
        result.check()
    assert failed.value.result is result


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_reports_the_signal(program):
    prog = program("""
    import os, signal, time
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    """)
    result = launch(prog, nproc=2)
    root = result.root_cause
    assert result.exit_code == 1
    assert (root.rank, root.exit_code, root.signal) == (0, None, signal.SIGKILL)
    assert root.error == "rank 0 was killed by SIGKILL"


@pytest.mark.timeout(60)
def test_ctrl_c_during_a_job_ends_every_rank_and_says_so(program, tmp_path):
    prog = program("""
    import os, sys, time
    open(os.path.join(sys.argv[1], "started" + os.environ["RANK"]), "w").close()
    time.sleep(60)
    """)

    def interrupt_once_both_ranks_run():   # not earlier: before the job watches signals, it would end pytest
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all((tmp_path / f"started{r}").exists() for r in (0, 1)):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_once_both_ranks_run, daemon=True).start()
    result = launch(prog, tmp_path, nproc=2)
    assert (result.exit_code, result.interrupted_by, result.root_cause) == (130, signal.SIGINT, None)
    assert [r.state for r in result.ranks] == ["killed", "killed"]
    assert "interrupted by SIGINT" in result.report


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kwargs,expected", [
    (dict(nproc=0), "nproc must be an integer >= 1, got 0"),
    (dict(comm="mpi"), "comm must be one of shm, gloo, nccl, hccl, got 'mpi'"),
    (dict(nnodes=2, secret="s", comm="shm"), "comm 'shm' works within one host only"),
    (dict(nnodes=2), "nnodes 2 needs secret"),
    (dict(timeout_s=0), "timeout_s must be a positive number"),
    (dict(job_id="a/b"), "job_id may hold only letters"),
    (dict(backend="slurm"), "backend must be one of local, ray, got 'slurm'"),
    (dict(backend="ray", placement="strict"), "backend 'ray': placement must be one of pack, spread, got 'strict'"),
    (dict(backend="ray", rank_resources="CPU"), "rank_resources: 'CPU' is not NAME=AMOUNT"),
    (dict(backend="ray", nnodes=2, secret="s", comm="gloo"), "backend 'ray': Ray places the ranks on its nodes"),
])
def test_arguments_that_cannot_work_raise_before_any_rank_starts(program, kwargs, expected):
    prog = program("raise SystemExit('a rank ran')\n")
    with pytest.raises(ConfigError, match=expected):
        launch(prog, **kwargs)


@pytest.mark.timeout(30)
def test_a_missing_program_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"no such file: .*nothere\.py \(to run a module, pass module=True\)"):
        launch(tmp_path / "nothere.py")


@pytest.mark.timeout(60)
def test_a_job_launched_from_another_thread_runs_and_reports(program):
    prog = program("""
    import os, sys
    sys.exit(5 if os.environ["RANK"] == "1" else 0)
    """)
    results = []
    worker = threading.Thread(target=lambda: results.append(launch(prog, nproc=2)))
    worker.start()
    worker.join(50)
    assert len(results) == 1, "the launch did not return"
    assert (results[0].exit_code, results[0].root_cause.rank, results[0].root_cause.exit_code) == (1, 1, 5)


@pytest.mark.timeout(30)
def test_importing_the_launcher_does_not_import_torch_or_ray():
    code = "import sys, pypto_rt.launch; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=25, check=True)
    assert out.stdout.strip() == "False False"
