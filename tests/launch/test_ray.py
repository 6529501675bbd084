"""`pypto-launch --backend ray` and `run_function(..., backend="ray")` on Ray clusters this module starts.

One loopback cluster serves the module: a head node (4 CPUs) and a second node joining it, each with 2 units of
the custom resource `slot` (so `--rank-resources CPU=1,slot=1` places 4 ranks as 2 nodes x 2). Jobs without
`--address` start (and must stop) their own Ray instance. Every job must leave none of its shared memory
(tests.multirank.launched checks `pypto-<job id>*`, the per-node `.n<k>` namespaces included) and no Ray process.
Token auth is off for the cluster and the drivers (RAY_AUTH_MODE=disabled).
"""
from __future__ import annotations

import json
import os
import re

import pytest

from tests.launch.ray_cluster import LocalCluster
from tests.multirank.launched import launch

ray = pytest.importorskip("ray")   # the [ray] extra; `make test` installs it

HERE = os.path.dirname(os.path.abspath(__file__))
PROGS = os.path.join(HERE, "ray_progs")
C09 = os.path.join(os.path.dirname(HERE), "conformance", "c09_allgather_launched.py")
MOE = os.path.join(os.path.dirname(HERE), "kernels", "moe", "progs", "moe_layer.py")
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster()
    try:
        c.start_head(4, '{"slot": 2}')
        c.add_node(2, '{"slot": 2}')
        c.wait_for_nodes(2)
        yield c
    finally:
        c.stop()
    assert not c.pids(), "the test cluster's Ray processes outlived it"


def ray_processes() -> set[int]:
    """Every Ray server process on the machine (GCS, raylet), by pid."""
    found = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() in ("gcs_server", "raylet"):
                    found.add(int(pid))
        except OSError:
            pass
    return found


def run(nproc: int, prog: str, *flags: str, args: tuple = (), address: str | None = None, limit_s: float = 240):
    """A ray job (attached when `address`); a job that started its own Ray must leave no Ray process behind."""
    before = ray_processes()
    where = ("--address", address) if address else ()
    job = launch(nproc, prog, "--backend", "ray", *where, *flags, args=args, env=NO_AUTH, limit_s=limit_s)
    if not address:
        assert not ray_processes() - before, "the job's own Ray instance outlived it"
    return job


def _passed(job, nproc: int, pattern: str, count: int = 1):
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(nproc):
        assert len(re.findall(pattern.format(rank=rank, nproc=nproc), job.out)) == count, job.out[-3000:]
    assert "FAIL" not in job.out


# c09 and the MoE layer at 2 and 4 ranks, on a Ray instance the job starts and attached to the cluster: each
# program at each rank count once and in each mode once (the full 2 x 2 x 2 matrix passes too, but costs ~6 min
# on a shared 2-core machine: a job that starts its own Ray pays ~10 s, every rank ~4 s of torch import)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("program, nproc, attached", [("c09", 2, False), ("c09", 4, True), ("moe", 2, True),
                                                      ("moe", 4, False)],
                         ids=["c09-2-own-ray", "c09-4-attached", "moe-2-attached", "moe-4-own-ray"])
def test_the_conformance_and_moe_programs_pass_on_every_rank(cluster, program, nproc, attached):
    address = cluster.address if attached else None
    if program == "c09":
        job = run(nproc, C09, address=address)
        _passed(job, nproc, r"\[rank {rank}\] rank {rank}/{nproc}: PASS")
    else:
        job = run(nproc, MOE, "--timeout-s", "120", args=("--calls", "1"), address=address)
        _passed(job, nproc, r"\brank {rank}/{nproc}: PASS ", count=2)


@pytest.mark.timeout(300)
def test_two_nodes_of_two_ranks_share_windows_within_a_node_and_collectives_across(cluster):
    """Also: a job-wide shm communicator (what a window op's first allocation makes) is refused at once, naming
    each node's ranks and what to do (two_nodes.py checks the message)."""
    job = run(4, os.path.join(PROGS, "two_nodes.py"), "--comm", "gloo", "--rank-resources", "CPU=1,slot=1",
              "--timeout-s", "60", address=cluster.address)
    _passed(job, 4, r"\[rank {rank}\] rank {rank}/4 node \d local \d/2: PASS node_sum=\d+ total=20")
    nodes = {int(n) for n in re.findall(r"rank \d/4 node (\d)", job.out)}
    assert nodes == {0, 1}


@pytest.mark.timeout(300)
def test_a_failing_rank_ends_the_job_with_its_root_cause_and_leaves_nothing(cluster, tmp_path):
    logs = tmp_path / "logs"
    job = run(2, os.path.join(PROGS, "fail_after_window.py"), "--timeout-s", "60", "--log-dir", str(logs), "--tee",
              args=("raise",))
    assert job.rc == 1, job.out[-3000:] + job.err[-3000:]
    summary = job.err.split("pypto-launch: job", 1)[-1]
    assert "rank 1 failed first" in summary and "rank 1 broke on purpose after its window" in summary, summary
    assert "unexpectedly passed" not in job.out
    # --log-dir holds what the local backend's does: the output, and the error record brought back from the actor
    record = json.loads((logs / "rank1.error.json").read_text())
    assert record["rank"] == 1 and "broke on purpose" in record["message"]
    assert "broke on purpose" in (logs / "rank1.stderr.log").read_text()
    assert "[rank 1] " in job.err   # --tee: also on the terminal


@pytest.mark.timeout(300)
def test_a_rank_whose_actor_dies_ends_the_job_naming_it(cluster):
    job = run(2, os.path.join(PROGS, "fail_after_window.py"), "--timeout-s", "60", args=("kill-actor",),
              address=cluster.address)
    assert job.rc == 1, job.out[-3000:] + job.err[-3000:]
    summary = job.err.split("pypto-launch: job", 1)[-1]
    assert re.search(r"rank 1 failed first .*\n.*its Ray actor died", summary), summary
    assert "unexpectedly passed" not in job.out


def square_plus_rank(x: int) -> dict:
    rank = int(os.environ["RANK"])
    if x < 0 and rank == 1:
        raise ValueError(f"rank {rank} refuses {x}")
    return {"rank": rank, "value": x * x + rank}


@pytest.mark.timeout(300)
def test_run_function_returns_each_ranks_value_and_raises_with_the_root_cause(cluster, monkeypatch):
    from pypto_rt.launch import JobFailed, run_function
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.chdir(os.path.dirname(os.path.dirname(HERE)))   # the ranks import this module by name
    options = {"nproc": 2, "backend": "ray", "address": cluster.address}
    assert run_function(square_plus_rank, 3, **options) == [{"rank": 0, "value": 9}, {"rank": 1, "value": 10}]
    with pytest.raises(JobFailed) as failed:
        run_function(square_plus_rank, -2, **options)
    root = failed.value.result.root_cause
    assert root.rank == 1 and "ValueError: rank 1 refuses -2" in root.error
    assert "rank 1 failed first" in str(failed.value)
    assert not ray.is_initialized()   # the driver left the cluster as it found it


@pytest.mark.timeout(120)
def test_run_function_on_the_local_backend_returns_each_ranks_value(monkeypatch):
    from pypto_rt.launch import run_function
    monkeypatch.chdir(os.path.dirname(os.path.dirname(HERE)))
    assert run_function(square_plus_rank, 4, nproc=2) == [{"rank": 0, "value": 16}, {"rank": 1, "value": 17}]


@pytest.mark.timeout(300)
def test_a_rank_gets_the_users_thread_count_or_its_nodes_share_never_its_launchers(monkeypatch):
    """One rank on its node: its share is the node's usable cores (Ray's own default for an actor would be its
    bundle's CPU, 1). A driver that is itself a launched rank carries its host's share (PYPTO_THREADS_SET names
    it): that stays behind; an OMP_NUM_THREADS the user set reaches the rank."""
    cores = len(os.sched_getaffinity(0))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYPTO_GOLDEN_NUM_THREADS", "PYPTO_THREADS_SET"):
        monkeypatch.delenv(name, raising=False)
    launched = {"OMP_NUM_THREADS": "64", "PYPTO_GOLDEN_NUM_THREADS": "64",
                "PYPTO_THREADS_SET": "OMP_NUM_THREADS,PYPTO_GOLDEN_NUM_THREADS"}
    base = dict(os.environ)
    for env, want in (({}, cores), (launched, cores), ({"OMP_NUM_THREADS": "3"}, 3)):
        monkeypatch.setattr(os, "environ", {**base, **env})
        job = run(1, os.path.join(PROGS, "threads.py"))
        assert job.rc == 0, job.out[-2000:] + job.err[-2000:]
        seen = json.loads(re.search(r"\[rank 0\] THREADS (.*)", job.out).group(1))
        assert seen == {"torch": want, "golden": want, "omp": str(want), "golden_env": str(want)}, (env, seen)
