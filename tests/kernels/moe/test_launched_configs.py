"""tests/kernels/moe/launched_configs.py: a shared job's output split per configuration, each failing on its own."""
from tests.kernels.moe.launched_configs import split
from tests.launch.job_result import Job

# two ranks, three configurations (interleaved as a launcher prints them): 0 passes, 1 fails on rank 1, 2 never ends
OUT = """[rank 0] rank 0/2: CONFIG 0 begins
[rank 1] rank 1/2: CONFIG 0 begins
[rank 1] rank 1/2: PASS call 0: combine
[rank 0] rank 0/2: PASS call 0: combine
[rank 0] rank 0/2: CONFIG 0 ends ok
[rank 0] rank 0/2: CONFIG 1 begins
[rank 1] rank 1/2: CONFIG 0 ends ok
pypto-launch: a line of the launcher's own
[rank 1] rank 1/2: CONFIG 1 begins
[rank 0] rank 0/2: PASS call 0: combine
[rank 1] rank 1/2: FAIL call 0: combine
[rank 1] rank 1/2: CONFIG 1 ends not ok
[rank 0] rank 0/2: CONFIG 1 ends ok
[rank 0] rank 0/2: CONFIG 2 begins
[rank 0] rank 0/2: PASS call 0: combine
[rank 1] rank 1/2: CONFIG 2 begins
"""


def test_each_configuration_gets_its_ranks_lines_and_passes_only_when_every_rank_ends_it_ok():
    passed, failed, unfinished = split(Job(1, OUT, "the job's stderr", 12.5), nproc=2, count=3)
    assert passed.rc == 0 and passed.out.splitlines() == ["[rank 1] rank 1/2: PASS call 0: combine",
                                                          "[rank 0] rank 0/2: PASS call 0: combine"]
    assert failed.rc == 1 and "FAIL" in failed.out and "launcher's own" not in failed.out
    assert unfinished.rc == 1 and unfinished.out.splitlines() == ["[rank 0] rank 0/2: PASS call 0: combine"]
    assert all(j.err == "the job's stderr" and j.seconds == 12.5 for j in (passed, failed, unfinished))
    # a job that exited 0 without a rank's end of a configuration still fails that configuration
    assert [j.rc for j in split(Job(0, OUT, "", 1.0), nproc=2, count=3)] == [0, 1, 1]
