"""A host-form rank ends when its host does (even with its main thread busy), and the last rank out removes the
job's segments: fake ranks forked from this process, which plays the host (and, holding the rank lock, a rank)."""
from __future__ import annotations

import fcntl
import glob
import multiprocessing
import os
import secrets
import time

import pytest

from pypto_rt.collective.segments import path_of, remove_segments, segment_name
from pypto_rt.host_form.lifeline import Lifeline

_FORK = multiprocessing.get_context("fork")


def _busy_rank(lifeline: Lifeline) -> None:
    lifeline.host_end.close()   # as a host-form rank does first: only the host holds the write end
    lifeline.watch()
    open(path_of(segment_name(lifeline.prefix, "w0-r0")), "w").close()
    while True:   # a kernel that never looks at the host
        sum(range(10_000))


def _segments(prefix: str) -> list[str]:
    return glob.glob(path_of(prefix) + "*")


def _until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.fixture
def lifeline():
    made = Lifeline(f"pypto-lifeline-test-{os.getpid()}-{secrets.token_hex(3)}")
    yield made
    made.close()
    remove_segments(made.prefix)


@pytest.mark.timeout(30)
def test_a_busy_rank_ends_with_its_host_and_the_last_rank_out_removes_the_segments(lifeline):
    rank = _FORK.Process(target=_busy_rank, args=(lifeline,), daemon=True)
    rank.start()
    try:
        made_by_rank = path_of(segment_name(lifeline.prefix, "w0-r0"))
        assert _until(lambda: os.path.exists(made_by_rank), 10), "the rank never started"
        still_running = os.open(lifeline.lock_path, os.O_RDONLY)   # this process: a rank that has not ended yet
        fcntl.flock(still_running, fcntl.LOCK_SH)
        lifeline.close()   # the host ends
        rank.join(3)
        assert rank.exitcode == 1, "the rank did not end with its host"
        time.sleep(0.3)
        assert path_of(segment_name(lifeline.prefix, "w0-r0")) in _segments(lifeline.prefix), \
            "segments were removed while a rank still ran"
        open(path_of(segment_name(lifeline.prefix, "w1-r1")), "w").close()   # made by that rank on its way out
        os.close(still_running)   # the last rank ends
        assert _until(lambda: not _segments(lifeline.prefix), 3), _segments(lifeline.prefix)
    finally:
        if rank.is_alive():
            rank.kill()


@pytest.mark.timeout(30)
def test_a_rank_that_starts_after_its_job_was_cleaned_up_ends_at_once(lifeline):
    remove_segments(lifeline.prefix)   # what a cleaner (or the host) does once every rank has ended
    rank = _FORK.Process(target=_busy_rank, args=(lifeline,), daemon=True)
    rank.start()
    rank.join(10)
    try:
        assert rank.exitcode == 1
        assert not _segments(lifeline.prefix)
    finally:
        if rank.is_alive():
            rank.kill()
