"""MoEDecoder in a launched 2-rank job (progs/decoder_ranks.py): ranks serve different requests, one rank steps
with no tokens, the experts are split across the ranks; every rank's tokens equal the golden's."""
import os
import re

import pytest

from tests.multirank.launched import launch

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "decoder_ranks.py")


@pytest.mark.timeout(240)
def test_two_ranks_with_different_requests_give_the_goldens_tokens():
    job = launch(2, PROG, "--timeout-s", "120", limit_s=220)
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(2):
        assert re.search(rf"\brank {rank}/2: PASS tokens equal the golden's", job.out), job.out[-3000:]
