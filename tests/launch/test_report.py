"""The failure summary from synthetic rank results (no processes): first failure, rank fates, wait merging."""
from __future__ import annotations

import signal
import sys
import types

import pytest

from pypto_rt.errors import find_wait
from pypto_rt.launch.report import RankResult, first_failure, merge_waits, summarize

T = 1_000_000.0
WAIT0 = {"rank": 0, "op": "wait", "label": "ag", "window": "signal", "cell": [1, 0], "seen": 0, "expected": 1,
         "cmp": "Ge", "peers": [1], "waited_s": 5.0}
WAIT1 = dict(WAIT0, rank=1, cell=[0, 0], peers=[0])


def _failed(rank, at, ended, wait=None, code=1):
    record = {"rank": rank, "time": at, "exit_code": code, "message": f"Traceback ...\nValueError: r{rank}",
              "wait": wait}
    return RankResult(rank, rank, 100 + rank, code, ended, record=record)


@pytest.mark.timeout(10)
def test_first_failure_is_by_error_time_then_by_exit_time():
    late_exit_early_error = _failed(2, at=T + 1, ended=T + 9)
    early_exit_late_error = _failed(0, at=T + 2, ended=T + 3)
    no_record = RankResult(3, 3, 103, 7, ended_at=T + 1.5)
    assert first_failure([early_exit_late_error, late_exit_early_error, no_record]) is late_exit_early_error
    assert first_failure([early_exit_late_error, no_record]) is no_record


@pytest.mark.timeout(10)
def test_summary_names_every_rank_fate():
    results = [
        _failed(2, at=T + 1, ended=T + 2),
        _failed(0, at=T + 1.5, ended=T + 2),
        RankResult(1, 1, 101, -signal.SIGTERM, T + 3, signalled=signal.SIGTERM, signalled_at=T + 2.1),
        RankResult(3, 3, 103, -signal.SIGKILL, T + 6, signalled=signal.SIGKILL, signalled_at=T + 2.1),
        RankResult(4, 4, 104, 0, T + 0.5, left_processes=True),
        RankResult(5, 5, 105, -signal.SIGSEGV, T + 4),
    ]
    text = summarize(results, "job1")
    assert "job job1" in text and "rank 2 failed first (exit code 1" in text and "ValueError: r2" in text
    assert "rank 0: failed 0.50 s later (exit code 1): ValueError: r0" in text
    assert "rank 1: killed by the launcher (SIGTERM)" in text
    assert "rank 3: killed by the launcher (SIGKILL)" in text
    assert "rank 4: exited 0; it left processes running, which the launcher ended" in text
    assert "rank 5: failed" in text and "killed by SIGSEGV" in text and "rank 5 was killed by SIGSEGV" in text


@pytest.mark.timeout(10)
def test_wait_merge_uses_the_collective_layer_when_present(monkeypatch):
    fake = types.ModuleType("pypto_rt.collective.waits")
    fake.merge_reports = lambda waits: "MERGED " + ",".join(str(w["rank"]) for w in waits)
    monkeypatch.setitem(sys.modules, "pypto_rt.collective.waits", fake)
    text = summarize([_failed(0, T, T, WAIT0), _failed(1, T + 1, T + 1, WAIT1)], "j")
    assert "cross-rank waits" in text and "MERGED 0,1" in text


@pytest.mark.timeout(10)
def test_wait_merge_falls_back_to_one_line_per_rank(monkeypatch):
    monkeypatch.setitem(sys.modules, "pypto_rt.collective.waits", None)  # import fails
    lines = merge_waits([WAIT1, WAIT0, {"rank": 2, "op": "barrier"}]).splitlines()
    assert lines[0].startswith("rank 0: wait 'ag' waited 5.0 s on signal[[1, 0]] for Ge 1 (saw 0) from peers [1]")
    assert lines[1].startswith("rank 1: ") and lines[2] == "rank 2: op=barrier"


@pytest.mark.timeout(10)
def test_a_broken_merger_never_hides_the_waits(monkeypatch):
    fake = types.ModuleType("pypto_rt.collective.waits")
    fake.merge_reports = lambda waits: 1 / 0
    monkeypatch.setitem(sys.modules, "pypto_rt.collective.waits", fake)
    text = merge_waits([WAIT0])
    assert "merging the wait reports failed" in text and "rank 0: wait 'ag'" in text


@pytest.mark.timeout(10)
def test_find_wait_follows_error_cause_and_context():
    class Wrapper(Exception):
        def __init__(self, error):
            self.error = error

    inner = TimeoutError("stalled")
    inner.wait = WAIT0
    assert find_wait(Wrapper(inner)) is WAIT0
    try:
        try:
            raise inner
        except TimeoutError as e:
            raise RuntimeError("task failed") from e
    except RuntimeError as outer:
        assert find_wait(outer) is WAIT0
    try:
        try:
            raise Wrapper(inner)
        except Wrapper:
            raise KeyError("during handling")
    except KeyError as outer:
        assert find_wait(outer) is WAIT0
    assert find_wait(ValueError("no wait")) is None


@pytest.mark.timeout(10)
def test_a_rank_failing_because_a_peer_died_is_not_the_root_cause_while_another_failed():
    victim = RankResult(0, 0, 100, 1, T + 0.2, record={"time": T + 0.01, "exit_code": 1, "peer_caused": True,
                                                       "message": "PeerAbortedError: rank 1 died"})
    silent = RankResult(1, 1, 101, 3, ended_at=T + 0.05)   # os._exit(3), timed a little late
    assert first_failure([victim, silent]) is silent
    assert first_failure([victim]) is victim


@pytest.mark.timeout(10)
def test_a_rank_without_a_record_is_reported_with_its_last_stderr_words():
    tail = ("noise\n" * 20 + "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
            "  what():  [enforce fail at pair.cc:456] 8 vs 4. Is there a distributed collective mismatch?\n"
            "Exception raised from run at x.cpp:1 (most recent call first):\nframe #0: f\n")
    aborted = RankResult(0, 0, 100, -signal.SIGABRT, T, stderr_tail=tail)
    assert aborted.message.splitlines() == [
        "rank 0 was killed by SIGABRT; its stderr ended with:",
        "  terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "    what():  [enforce fail at pair.cc:456] 8 vs 4. Is there a distributed collective mismatch?"]
    plain = RankResult(1, 1, 101, 3, T, stderr_tail="a\nb\n\nc\n" + "x\n" * 6)
    assert plain.message.splitlines() == ["rank 1 exited with code 3; its stderr ended with:"] + ["  x"] * 6
    assert RankResult(2, 2, 102, 3, T).message == "rank 2 exited with code 3"
