"""Multi-rank programs under `pypto-launch`: program order of communication, hangs that end with a report.

Every job runs in a subprocess (`pypto-launch` next to this interpreter) with its own `--job-id`, and must leave
none of its `/dev/shm/pypto-<job id>*` segments behind. Other jobs on the machine may create and remove pypto-*
segments meanwhile, so only segments of this test's job count.
"""
from __future__ import annotations

import os
import re

import pytest

from pypto_rt.collective import process
from tests.multirank.launched import launch

HERE = os.path.dirname(os.path.abspath(__file__))
PROGS = os.path.join(HERE, "progs")
C09 = os.path.join(os.path.dirname(HERE), "conformance", "c09_allgather_launched.py")


# 2 and 8 ranks (the dynamic rank count at two values, 8 the largest job of the suite); 4 ranks of c09 run under
# the Ray backend (tests/launch/test_ray.py, c09-4-attached), where a rank's start-up costs the same
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc", [2, 8])
def test_c09_allgather_passes_on_every_rank(nproc):
    job = launch(nproc, C09)
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(nproc):
        assert f"rank {rank}/{nproc}: PASS" in job.out


@pytest.mark.timeout(60)
def test_send_then_receive_on_one_worker_follows_program_order():
    # recv is ready before send (send waits for a slow task's output; recv shares no tensor-map tensor with
    # either): only the chain of communication tasks keeps the rank's one worker from taking recv first and
    # waiting forever (without the chain this job times out on both ranks with a wait report)
    job = launch(2, os.path.join(PROGS, "send_recv_one_worker.py"), "--timeout-s", "10",
                 env={"PYPTO_NUM_WORKERS": "1"})
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    assert "rank 0/2: PASS" in job.out and "rank 1/2: PASS" in job.out


@pytest.mark.timeout(60)
def test_a_wait_nobody_satisfies_ends_with_a_report_naming_rank_region_cell_and_values():
    timeout_s = 2
    job = launch(2, os.path.join(PROGS, "wait_never_satisfied.py"), "--timeout-s", str(timeout_s))
    assert job.rc != 0
    # start-up (torch import) + the deadline + the report, generous for a loaded host; not the 300 s default
    assert job.seconds < timeout_s + 40, job.seconds
    summary = job.err.split("pypto-launch: job", 1)[-1]
    first = re.search(r"rank (\d) failed first", summary)
    assert first, job.err[-3000:]
    rank = int(first.group(1))
    line = (f"rank {rank} waits in `wait` (label never_notified) for cell [{rank}, 0] of window 'w0' "
            f"(seen 0, expected >= {rank + 7})")
    assert line in summary, job.err[-3000:]
    # the other rank timed out too, or its wait ended when the first one's failure aborted the communicator
    assert f"rank {1 - rank}: " in summary, job.err[-3000:]


@pytest.mark.timeout(120)
def test_mismatched_collectives_with_comm_check_name_both_ranks_and_their_calls():
    job = launch(3, os.path.join(PROGS, "mismatched_collectives.py"), "--timeout-s", "60",
                 env={"PYPTO_COMM_CHECK": "1"})
    assert job.rc != 0
    assert job.seconds < 50, job.seconds   # an error, not a wait until the 60 s deadline (generous: loaded host)
    assert "no error" not in job.out
    summary = job.err.split("pypto-launch: job", 1)[-1]
    first = re.search(r"rank (\d) failed first", summary)
    assert first and "collective #0 differs across ranks" in summary, job.err[-3000:]
    calls = {0: "allreduce((4,) float32, op=sum)", 1: "allreduce((8,) float32, op=sum)", 2: "broadcast("}
    expected = {0: f"rank 0 calls {calls[0]} but rank 1 calls {calls[1]}",
                1: f"rank 1 calls {calls[1]} but rank 0 calls {calls[0]}",
                2: f"rank 2 calls {calls[2]}"}
    failed = [r for r in range(3) if r == int(first.group(1)) or f"rank {r}: failed" in summary]
    for rank in failed:   # a rank the launcher ended first (SIGTERM) reports nothing
        assert expected[rank] in summary, job.err[-3000:]
    if 2 in failed:
        assert f"but rank 0 calls {calls[0]}" in summary


@pytest.mark.timeout(60)
def test_rank_and_world_size_come_from_the_launcher():
    job = launch(3, os.path.join(PROGS, "rank_and_world.py"))
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(3):
        assert f"rank {rank} of 3" in job.out


def test_rank_and_world_size_outside_the_launcher_are_0_and_1(monkeypatch):
    import pypto.language.distributed as pld

    for name in ("PYPTO_LAUNCHED", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(process, "_comm", None)   # no communicator installed by an earlier test
    assert (pld.rank(), pld.world_size()) == (0, 1)


# A rank raising at start ends a 4-rank job within 30 s naming that rank: tests/launch/test_jobs.py
# (test_a_rank_raising_at_start_ends_the_job_naming_rank_error_and_line), not repeated here.


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["compiled", "reference"])
def test_one_sided_ops_and_collectives_in_kernels_and_plain_python(executor):
    job = launch(3, os.path.join(PROGS, "one_sided_and_collectives.py"), "--timeout-s", "30",
                 env={"PYPTO_EXECUTOR": executor})
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    assert job.out.count(": PASS") == 3 * 9 + 1 and "FAIL" not in job.out, job.out[-3000:]


@pytest.mark.timeout(120)
def test_a_communicating_entry_called_every_step_replays_on_every_rank():
    job = launch(2, os.path.join(PROGS, "comm_replay.py"), "--comm", "shm", "--timeout-s", "30",
                 env={"PYPTO_STATS": "1"})
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(2):
        line = re.search(rf"rank {rank}: PASS (.*)", job.out)
        assert line, job.out[-3000:]
        # no guard on the epoch or the counts (they change every call), no timed trial (peer waits are noise); the
        # loop over a count read from the window refuses the first recording inside the block (replay.comm_block)
        assert line.group(1).split() == ["engine", "engine", "engine", "recorded"] + ["replayed"] * 8, line.group(0)
    # PYPTO_STATS=1 shows the decision, and that the communication block is called as it is
    assert re.search(r"pypto-rt stats \[ring_step\]: replayed: replay of \d+ torch calls and 1 kernel blocks "
                     r"called as they are", job.err), job.err[-3000:]
