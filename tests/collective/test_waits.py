"""Backoff waits, wait records and the merged cross-rank wait-for picture (pure functions, no processes)."""
from __future__ import annotations

import time

import pytest

from pypto_rt.collective import WAIT_KEYS, CommTimeoutError, merge_reports
from pypto_rt.collective.waits import backoff_wait, describe, timeout_error, wait_record


def signal_wait(rank, peers, label="recv", seen=0):
    return wait_record(rank, "wait", label, "signal", [rank, 0], seen, 1, "ge", peers, 2.0)


def barrier_wait(rank, peers, op="barrier"):
    return wait_record(rank, op, None, seen=[3] * len(peers), expected=4, cmp="ge", peers=peers, waited_s=2.0)


def test_a_wait_record_has_exactly_the_documented_keys():
    w = wait_record(1, "wait", "recv", "signal", (0, 0), 0, 1, "ge", {2, 0}, 1.23456)
    assert tuple(w) == WAIT_KEYS
    assert w["cell"] == [0, 0] and w["peers"] == [0, 2] and w["waited_s"] == 1.235


def test_describe_names_cell_window_values_setter_and_time():
    assert describe(signal_wait(1, [0])) == ("rank 1 waits in `wait` (label recv) for cell [1, 0] of window 'signal' "
                                             "(seen 0, expected >= 1), which rank 0 would set for 2.0 s")
    assert describe(barrier_wait(0, [1, 2])) == ("rank 0 waits in `barrier` for ranks 1, 2 (seen [3, 3], "
                                                 "expected >= 4) for 2.0 s")
    assert describe(wait_record(0, "allreduce", "grad", waited_s=300)) == \
        "rank 0 waits in `allreduce` (label grad) for 300.0 s"


def test_merge_names_a_rank_that_is_not_waiting_as_the_root():
    text = merge_reports([signal_wait(1, [0]), barrier_wait(2, [1])], world_size=3)
    assert text.splitlines() == [
        "cross-rank wait-for picture (2 ranks waiting, rank 0 not):",
        "  rank 1 waits in `wait` (label recv) for cell [1, 0] of window 'signal' (seen 0, expected >= 1), which "
        "rank 0 would set for 2.0 s",
        "  rank 2 waits in `barrier` for rank 1 (seen [3], expected >= 4) for 2.0 s",
        "root:",
        "  rank 0 sent no report: it is not waiting in a communicator op (busy, finished or dead) and ranks 1, 2 "
        "wait on it"]


def test_merge_names_a_cycle_and_is_deterministic():
    reports = [barrier_wait(2, [0]), signal_wait(0, [1]), signal_wait(1, [0]), ]
    text = merge_reports(reports)
    assert text == merge_reports(list(reversed(reports)))
    assert text.endswith("root:\n  cycle rank 0 -> rank 1 -> rank 0: each waits on the next (notify/wait that do "
                         "not match, or collectives called in a different order)")
    assert "rank 2 waits in `barrier` for rank 0" in text   # waits on the cycle, but is not its root


def test_merge_with_unknown_setters_and_several_roots():
    text = merge_reports([signal_wait(0, None), barrier_wait(1, [3]), barrier_wait(2, [2])])
    assert text.splitlines()[-4:] == [
        "roots:",
        "  rank 0 does not know which rank would satisfy its wait (pass peers= to wait)",
        "  rank 2 waits on no other rank",
        "  rank 3 sent no report: it is not waiting in a communicator op (busy, finished or dead) and rank 1 "
        "waits on it"]
    assert merge_reports([]) == "no rank reported a wait"


def test_timeout_error_carries_the_record():
    err = timeout_error(signal_wait(1, [0]))
    assert isinstance(err, CommTimeoutError) and err.wait["cell"] == [1, 0]
    assert str(err).startswith("error: timed out: rank 1 waits in `wait`")
    assert "PYPTO_TIMEOUT_S" in str(err)


def test_backoff_wait_returns_when_ready_and_gives_up_at_the_deadline():
    assert backoff_wait(lambda: True, 1.0) == 0.0
    calls = []
    assert backoff_wait(lambda: calls.append(1) or len(calls) > 400, 5.0) is not None   # ready after sleeping
    start = time.monotonic()
    assert backoff_wait(lambda: False, 0.2) is None
    assert 0.2 <= time.monotonic() - start < 5   # not before the deadline; the bound only catches a hang


def test_backoff_wait_runs_watch_while_sleeping():
    class Gone(Exception):
        pass

    def watch():
        raise Gone
    with pytest.raises(Gone):
        backoff_wait(lambda: False, 5.0, watch)


@pytest.mark.parametrize("blocking", [False, True])
def test_a_wait_without_watch_keeps_pausing_past_the_watch_interval(blocking):
    """With no `watch`, nothing is due every WATCH_EVERY_S: the wait still sleeps (or blocks) until its deadline
    instead of polling without pause once the first watch interval has passed."""
    polls, pauses = [0], []

    def ready():
        polls[0] += 1
        return False

    def block(seconds):   # a futex stand-in: returns at once for a deadline already past, as the real one does
        pauses.append(seconds)
        if seconds > 0:
            time.sleep(min(seconds, 0.01))

    assert backoff_wait(ready, 0.3, spin=0, yields=0, block=block if blocking else None) is None
    assert polls[0] < 400   # 0.3 s of 1 ms sleeps or 10 ms blocks; polling without pause makes tens of thousands
    assert all(s > 0 for s in pauses)
