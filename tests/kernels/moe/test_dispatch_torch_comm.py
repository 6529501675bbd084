"""MoEBuffer on the torch communicator (`pypto-launch --comm gloo`): no windows, so dispatch and combine run the
collective transport (kernels/moe/dispatch_collective.py). The launched check program compares every rank's
recv.counts, recv.x rows and combine output against torch over three calls with uneven T (one rank has none).
"""
from __future__ import annotations

import os
import re

import pytest

from tests.kernels.moe.launched_configs import SharedJobs
from tests.multirank.test_launched import launch

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")
DISPATCH_COMBINE = os.path.join(PROGS, "dispatch_combine.py")
# the module's dispatch_combine.py checks at one rank count (each of a layout of its own) run as one job, a rank's
# start-up paid once (tests/kernels/moe/launched_configs.py); each test checks its configuration's lines
CHUNKS = ("--sum-chunk", "2", "--top-k", "3")
INF_ROW = ("--sum-chunk", "2", "--top-k", "3", "--experts-per-rank", "3", "--inf-row")
CONFIGS = {2: (("--routing", "uniform", "--dtype", "bf16"), ("--routing", "skewed", "--dtype", "fp32"), CHUNKS,
               INF_ROW),
           4: (("--routing", "uniform", "--dtype", "bf16"), ("--routing", "skewed", "--dtype", "fp32"))}


@pytest.fixture(scope="module")
def jobs():
    return SharedJobs(limit_s=170)


def _on_gloo(jobs, nproc: int, args: tuple):
    configs = CONFIGS[nproc]
    return jobs.job(nproc, DISPATCH_COMBINE, ("--comm", "gloo", "--timeout-s", "60"), configs, configs.index(args))


def _combines_pass(job) -> None:
    """Both ranks' combine matched torch on each of the three calls."""
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(2):
        for call in range(3):
            assert f"rank {rank}/2: PASS call {call}: combine" in job.out, job.out[-3000:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("routing,dtype", [("uniform", "bf16"), ("skewed", "fp32")])
def test_dispatch_and_combine_match_torch_on_gloo(jobs, nproc, routing, dtype):
    job = _on_gloo(jobs, nproc, ("--routing", routing, "--dtype", dtype))
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(nproc):
        for call in range(3):
            for check in ("recv.counts", "recv.x rows in (rank, token) order", "combine"):
                assert f"rank {rank}/{nproc}: PASS call {call}: {check}" in job.out, job.out[-3000:]


@pytest.mark.timeout(180)
def test_combine_on_gloo_sums_the_arrivals_in_chunks_with_a_short_last_one(jobs):
    # 2 arrived tokens per weighted-sum pass (dispatch_parts.SUM_CHUNK; 256 in the library): several passes, an
    # odd count a 1-token last one
    _combines_pass(_on_gloo(jobs, 2, CHUNKS))


@pytest.mark.timeout(180)
def test_combine_on_gloo_gives_inf_not_nan_for_an_inf_row_behind_a_dead_route_slot(jobs):
    # a token's route slots that live on another rank read a stand-in row here; a select zeroes it (weighing it 0
    # gave 0 * inf = NaN for a token whose live row is +inf)
    _combines_pass(_on_gloo(jobs, 2, INF_ROW))


@pytest.mark.timeout(180)
def test_a_bad_expert_id_on_gloo_names_the_rank_and_argument_and_ends_the_job():
    job = launch(2, os.path.join(PROGS, "bad_expert_id.py"), "--comm", "gloo", "--timeout-s", "120", limit_s=170)
    assert job.rc != 0
    summary = job.err.split("pypto-launch: job", 1)[-1]
    assert re.search(r"rank 1 failed first", summary), job.err[-3000:]
    assert "rank 1: MoEBuffer.dispatch: topk_idx[2, 1] = 4 is not an expert id (num_experts=4: ids 0..3)" \
        in summary, job.err[-3000:]
    assert "bad_expert_id.py:23" in summary, job.err[-3000:]     # the caller's line, not the library's
    assert "dispatch returned" not in job.out
    # rank 0, already in the dispatch's allgather, learns that its peer left; it does not wait out the 120 s
    assert "a peer left the job" in summary or "SIGTERM" in summary, job.err[-3000:]
    assert job.seconds < 110, job.seconds
