"""The adaptive poll budget of futex-backed shm waits (PYPTO_SHM_POLL_US unset): its decisions, not timings."""
from __future__ import annotations

import pytest

from pypto_rt.collective import poll_policy
from pypto_rt.collective.poll_policy import MAX_POLL_S, MIN_POLL_S, PollPolicy


class _Host:
    """A fake /proc/loadavg (load1, runnable now) and clock."""

    def __init__(self, load1=0.5, runnable=1):
        self.load1, self.runnable, self.now, self.reads = load1, runnable, 0.0, 0

    def read(self):
        self.reads += 1
        return None if self.runnable is None else (self.load1, self.runnable)

    def clock(self):
        return self.now

    def tick(self, seconds=poll_policy.SAMPLE_EVERY_S):
        self.now += seconds


def _policy(host, ranks=2, cores=2):
    return PollPolicy(ranks, cores, read_load=host.read, clock=host.clock)


def test_a_quiet_host_polls_a_new_site_up_to_the_cap_then_twice_its_typical_wait():
    host = _Host(runnable=2)
    policy = _policy(host)
    assert policy.budget("s") == MAX_POLL_S                      # nothing measured yet: probe with the cap
    for waited in (200e-6, 250e-6, 300e-6, 220e-6, 5e-3):           # one late wait does not move the median
        policy.record("s", waited)
    assert policy.budget("s") == pytest.approx(2 * 250e-6)
    for _ in range(8):
        policy.record("fast", 1e-6)
    assert policy.budget("fast") == MIN_POLL_S                      # a few microseconds: still a floor of polls


def test_a_site_whose_waits_usually_take_long_blocks_at_once_and_comes_back_when_they_shorten():
    policy = _policy(_Host(runnable=1))
    for _ in range(8):
        policy.record("slow", 2e-3)                                 # > MAX_POLL_S / 2: polling would not pay
    assert policy.budget("slow") == 0.0
    for _ in range(5):
        policy.record("slow", 0.8e-3)                               # blocked waits: the wake-up latency, no more
    assert policy.budget("slow") == pytest.approx(1.6e-3)
    assert policy.budget("other") == MAX_POLL_S                     # sites are independent


def test_more_runnable_tasks_than_cores_stop_the_polls_and_a_quiet_spell_restarts_them():
    host = _Host(runnable=3)                                        # another job's thread beside our two ranks
    policy = _policy(host)
    assert policy.budget("s") == 0.0
    host.runnable = 2
    allowed = []
    for _ in range(12):
        host.tick()
        allowed.append(policy.budget("s") > 0)
    assert allowed[0] is False and allowed[-1] is True              # a moving share: not one quiet sample
    host.runnable = 3
    for _ in range(3):
        host.tick()
        policy.budget("s")
    assert policy.budget("s") == 0.0                                # crowded again within a few samples


def test_the_host_is_read_at_most_once_per_sample_interval():
    host = _Host(runnable=2)
    policy = _policy(host)
    for _ in range(100):
        policy.budget("s")
    assert host.reads == 1
    host.tick()
    policy.budget("s")
    assert host.reads == 2


def test_a_high_load_average_more_ranks_than_cores_or_no_proc_never_poll():
    assert _policy(_Host(load1=3.5, runnable=1)).budget("s") == 0.0     # load1 over cores + 1
    assert _policy(_Host(runnable=1), ranks=4, cores=2).budget("s") == 0.0
    assert _policy(_Host(runnable=None)).budget("s") == 0.0              # no /proc/loadavg: the futex path


def test_the_load_reader_parses_proc_loadavg(tmp_path):
    path = tmp_path / "loadavg"
    path.write_text("1.25 0.80 0.40 3/212 4242\n")
    reader = poll_policy.LoadReader(str(path))
    assert reader() == (1.25, 3)
    reader.close()
    assert poll_policy.LoadReader(str(tmp_path / "missing"))() is None


def test_an_unset_knob_gives_the_shm_communicator_the_policy_and_a_set_one_a_fixed_poll(monkeypatch):
    from pypto_rt.collective import shm_communicator
    comm = object.__new__(shm_communicator.ShmCommunicator)
    comm._poll, comm._poll_s = _policy(_Host(runnable=1)), 0.0
    budget = comm._poll_budget(("w", 3))
    assert callable(budget) and budget() == MAX_POLL_S
    assert comm._waited(("w", 3), 40e-6) == 40e-6 and comm._poll.budget(("w", 3)) == MIN_POLL_S
    assert comm._waited(("w", 3), None) is None                          # a timeout is not a measurement
    comm._poll, comm._poll_s = None, 2.5e-3
    assert comm._poll_budget(("w", 3)) == 2.5e-3
