"""The supervisor itself (no launcher CLI): when it says a rank ended."""
from __future__ import annotations

import sys

import pytest

from pypto_rt.launch import supervisor
from pypto_rt.launch.signals import SignalWatch
from pypto_rt.launch.supervisor import RankSpec, Supervisor

# each rank sleeps a while (ranks end at different moments), writes the wall-clock time, and exits at once
ENDS_AT = """
import os, sys, time
time.sleep(0.15 + 0.07 * int(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    f.write(repr(time.time()))
os._exit(0)
"""


@pytest.mark.timeout(30)
def test_a_ranks_end_is_timed_when_it_happens_not_at_the_next_poll(tmp_path, monkeypatch):
    # before, the launcher timed an end when it next polled (every 0.1 s): ranks that noticed the death and wrote
    # their error records within 50 ms looked as if they had failed first. With a 2 s poll an end timed at the
    # next poll is over 1.5 s late (the ranks end within 0.4 s of starting), one timed at once is not: the bound
    # below tells the two apart on a loaded machine, where a tight bound (it was 0.04 s) flaked.
    monkeypatch.setattr(supervisor, "POLL_S", 2.0)
    stamps = [tmp_path / f"rank{r}.time" for r in range(4)]
    specs = [RankSpec(r, r, [sys.executable, "-c", ENDS_AT, str(stamps[r]), str(r)], {}, str(tmp_path / "err"),
                      echo=False) for r in range(4)]
    with SignalWatch() as watch:
        sup = Supervisor(specs, watch)
        sup.start()
        try:
            assert sup.run() is None
        finally:
            sup.end()
    late = [r.ended_at - float(stamps[r.spec.rank].read_text()) for r in sup.ranks]
    assert all(0 <= s < 0.5 for s in late), late
