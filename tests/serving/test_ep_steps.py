"""Every rank steps until every rank is done (2 launched ranks, a collective inside the model's forward)."""
from __future__ import annotations

import os
import re

import pytest

from tests.multirank.launched import launch

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "ep_steps.py")


@pytest.mark.timeout(120)
def test_an_idle_rank_steps_empty_until_every_rank_is_done():
    job = launch(2, PROG, "--timeout-s", "30")
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    found = dict(re.findall(r"rank (\d): PASS (steps=\d+ empty=\d+ calls=\d+)", job.out))
    assert set(found) == {"0", "1"}, job.out[-3000:]
    busy = dict(kv.split("=") for kv in found["0"].split())
    idle = dict(kv.split("=") for kv in found["1"].split())
    assert busy["steps"] == idle["steps"] == idle["empty"] and int(busy["steps"]) > 3
    assert busy["empty"] == "0" and busy["calls"] == idle["calls"]
