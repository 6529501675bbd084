"""bench/moe_floor.py, the eager-torch reference of MoE dispatch+combine over shm windows: it runs in a launched
job and its combine equals sum_k w[t, k] * x[t] (the identity expert), so its timings describe a correct
protocol."""
import os
import re

import pytest

from tests.multirank.launched import launch

FLOOR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                     "moe_floor.py")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc", [2, 4])
def test_floor_reference_matches_the_weighted_sum(nproc):
    job = launch(nproc, FLOOR, "--timeout-s", "60",
                 args=("--tokens", "5", "--hidden", "64", "--top-k", "3", "--iters", "3"), limit_s=110)
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    assert len(re.findall(r"output matches", job.out)) == nproc, job.out[-3000:]
