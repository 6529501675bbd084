"""Each launched rank's intra-op thread count: the host's cores shared among its ranks (torchrun's rule is 1 per rank
whenever nproc > 1), unless the user set OMP_NUM_THREADS or PYPTO_GOLDEN_NUM_THREADS."""
from __future__ import annotations

import json
import os

import pytest

from pypto_rt.launch import contract

THREADS = """
import json, os, sys
import torch
before = torch.get_num_threads()
import pypto_rt.golden   # sets its own count at import: it must follow the rank's share too
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"torch": before, "golden": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}, f)
"""


def _env(base: dict, local_world_size: int) -> dict:
    return contract.rank_env(base, rank=0, local_rank=0, world_size=local_world_size,
                             local_world_size=local_world_size, master_addr="127.0.0.1", master_port=1, comm="shm",
                             job_id="j", secret="s", error_file="e", stack_file="s", timeout_s=None)


def test_a_ranks_share_is_the_cores_over_the_local_ranks_at_least_one():
    assert [contract.intra_op_threads(n, cores=8) for n in (1, 2, 3, 4, 8, 16)] == [8, 4, 2, 2, 1, 1]
    assert contract.intra_op_threads(4, cores=2) == 1


def test_the_users_settings_are_kept():
    cores = len(os.sched_getaffinity(0))
    assert _env({}, 1)["OMP_NUM_THREADS"] == str(cores)
    assert _env({}, 1)["PYPTO_GOLDEN_NUM_THREADS"] == str(cores)
    assert (_env({"OMP_NUM_THREADS": "3"}, 4)["OMP_NUM_THREADS"], _env({"OMP_NUM_THREADS": "3"}, 4)[
        "PYPTO_GOLDEN_NUM_THREADS"]) == ("3", "3")
    mine = _env({"PYPTO_GOLDEN_NUM_THREADS": "5"}, 2 * cores)
    assert (mine["OMP_NUM_THREADS"], mine["PYPTO_GOLDEN_NUM_THREADS"]) == ("1", "5")


@pytest.mark.timeout(90)
def test_launched_ranks_run_their_share_of_the_cores(tmp_path, program, launch, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("PYPTO_GOLDEN_NUM_THREADS", raising=False)
    prog = program(THREADS)
    nproc = 2 * len(os.sched_getaffinity(0))   # more ranks than cores: one thread each (torch's default: all cores)
    job = launch("--nproc", str(nproc), prog, str(tmp_path))
    assert job.rc == 0, job.err
    seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(nproc)]
    assert seen == [{"torch": 1, "golden": 1, "omp": "1"}] * nproc
    monkeypatch.setenv("OMP_NUM_THREADS", "3")   # the user's choice wins
    assert launch("--nproc", "2", prog, str(tmp_path)).rc == 0
    assert json.loads((tmp_path / "1.json").read_text()) == {"torch": 3, "golden": 3, "omp": "3"}


def test_the_launcher_names_the_counts_it_chose_and_an_empty_value_is_unset():
    """PYPTO_THREADS_SET: what a --backend ray launch from this rank must not pass on as the user's."""
    cores = len(os.sched_getaffinity(0))
    outer = _env({}, 1)
    assert outer["PYPTO_THREADS_SET"] == "OMP_NUM_THREADS,PYPTO_GOLDEN_NUM_THREADS"
    assert _env(outer, 2)["PYPTO_THREADS_SET"] == outer["PYPTO_THREADS_SET"]   # (a local launch from it: kept)
    assert _env({"OMP_NUM_THREADS": "3"}, 1)["PYPTO_THREADS_SET"] == "PYPTO_GOLDEN_NUM_THREADS"
    assert "PYPTO_THREADS_SET" not in _env({"OMP_NUM_THREADS": "3", "PYPTO_GOLDEN_NUM_THREADS": "2"}, 1)
    assert _env({"OMP_NUM_THREADS": ""}, 1)["OMP_NUM_THREADS"] == str(cores)


def test_the_ray_driver_passes_on_only_the_users_thread_counts(monkeypatch):
    from pypto_rt.launch.ray_cluster import driver_env

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYPTO_GOLDEN_NUM_THREADS", "PYPTO_THREADS_SET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    assert (driver_env()["OMP_NUM_THREADS"], driver_env()["MKL_NUM_THREADS"]) == ("3", "2")
    monkeypatch.setenv("PYPTO_GOLDEN_NUM_THREADS", "3")
    monkeypatch.setenv("PYPTO_THREADS_SET", "OMP_NUM_THREADS,PYPTO_GOLDEN_NUM_THREADS")   # (the driver is a rank)
    passed = driver_env()
    assert "OMP_NUM_THREADS" not in passed and "PYPTO_GOLDEN_NUM_THREADS" not in passed, passed
    assert "PYPTO_THREADS_SET" not in passed and passed["MKL_NUM_THREADS"] == "2"
