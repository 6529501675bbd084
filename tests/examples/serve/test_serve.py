"""The flagship (examples/serve/serve.py) launched on 2 ranks at its tiny size: it serves every request, prints
the metrics and passes its golden check; a served token changed on purpose (--corrupt-request) makes it FAIL
with exit code 1."""
import os
import re

import pytest

from tests.multirank.launched import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SERVE = os.path.join(ROOT, "examples", "serve", "serve.py")
TINY = ("--size", "tiny", "--requests", "6", "--seed", "1")
METRICS = ("throughput ", "TTFT ", "TPOT ", "batch/step ", "prefix cache ", "experts ")


@pytest.mark.timeout(150)
def test_two_ranks_serve_the_stream_print_the_metrics_and_pass_the_golden_check():
    job = launch(2, SERVE, "--timeout-s", "100", args=TINY, limit_s=140)
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    assert "[rank 0] golden check PASS: 6/6 requests with tokens equal to the golden's" in job.out, job.out
    assert re.search(r"\[rank 0\] \[serve\] step +\d+  requests done +6/6", job.out), job.out
    for name in METRICS:
        assert f"[rank 0] {name}" in job.out, job.out
    experts = re.search(r"rows per expert .*: \[([\d, ]+)\]", job.out)
    assert experts and len(experts.group(1).split(",")) == 8, job.out
    assert "[rank 1] golden check" not in job.out and "[rank 1] [serve]" not in job.out   # rank 0 reports


@pytest.mark.timeout(150)
def test_a_wrong_token_makes_the_run_fail():
    job = launch(2, SERVE, "--timeout-s", "100", args=TINY + ("--corrupt-request", "3"), limit_s=140)
    assert job.rc == 1, job.out[-3000:] + job.err[-3000:]
    assert "[rank 0] golden check FAIL: 5/6 requests" in job.out, job.out
    assert re.search(r"\[rank 0\]   request 3: output token \d+: served \d+, golden \d+", job.out), job.out
