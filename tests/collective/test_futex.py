"""shm waits block on a futex of their cell after their yields: woken by the peer's signal write, never sleeping."""
from __future__ import annotations

import mmap
import os
import threading
import time
import types

import pytest
import torch

from pypto_rt.collective import create_communicator, futex, waits

pytestmark = pytest.mark.skipif(not futex.AVAILABLE or (os.cpu_count() or 1) < 2,
                                reason="futexes are Linux (x86-64 / aarch64) only; 2 ranks need 2 cores to use them")


def _cell():
    mm = mmap.mmap(-1, 4096)                      # shared anonymous memory, as a segment's mapping is
    return mm, memoryview(mm).cast("i"), torch.frombuffer(mm, dtype=torch.uint8).data_ptr()


def test_futex_wait_returns_on_the_wake_after_a_store_and_not_before():
    mm, cells, addr = _cell()
    returned = []

    def waiter():
        futex.wait(addr, 0, 20.0)
        returned.append(cells[0])
    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    assert t.is_alive()                            # blocked: the cell still holds 0
    cells[0] = 7
    futex.wake(addr)
    t.join(10.0)                                   # far below the 20 s timeout: only the wake ends it
    assert not t.is_alive() and returned == [7]


def test_futex_wait_on_a_changed_value_returns_at_once_and_a_timeout_ends_it():
    mm, cells, addr = _cell()
    cells[0] = 5
    futex.wait(addr, 4, 20.0)                      # the cell no longer holds 4: no sleep (else 20 s: timeout)
    start = time.monotonic()
    futex.wait(addr, 5, 0.05)
    assert time.monotonic() - start >= 0.04
    futex.wait(addr, 2**32 + 4, 20.0)              # an int64 value compares by its low 32 bits (4, not 5)
    assert futex.as_int32(2**32 + 5) == 5 and futex.as_int32(2**31) == -2**31


def test_backoff_wait_with_block_yields_then_blocks_never_sleeps_and_still_watches(monkeypatch):
    polled = []
    monkeypatch.setattr(waits, "time", types.SimpleNamespace(sleep=polled.append))
    monkeypatch.setattr(waits, "os", types.SimpleNamespace(sched_yield=lambda: polled.append("yield")))
    monkeypatch.setattr(waits, "WATCH_EVERY_S", 0.0)
    blocks, watched = [], []
    ready = lambda: len(blocks) >= 3   # noqa: E731
    assert waits.backoff_wait(ready, 5.0, lambda: watched.append(1), spin=2, yields=4, block=blocks.append) is not None
    assert polled == ["yield"] * 4 and len(blocks) == 3 and len(watched) == 3 and all(0 <= s <= 5.0 for s in blocks)
    assert waits.backoff_wait(lambda: False, 0.05, spin=0, block=lambda s: None) is None   # the deadline holds


def _ranks_as_threads(monkeypatch, late_rank_work, waiting_rank_work):
    """Two ranks as threads; the waiting rank's waits must not sleep (recorded per thread; yields are allowed) and
    the watch interval is 20 s, so only a futex wake by the late rank's signal can end them sooner."""
    import torch.distributed as dist
    real_sleep = time.sleep
    polled, waiting = [], threading.Event()

    def sleep(s):
        if waiting.is_set() and threading.current_thread().name == "rank1":
            polled.append(("sleep", s))
        real_sleep(s)

    real_block, blocked = futex.wait, threading.Event()

    def block(addr, seen, seconds):
        if waiting.is_set() and threading.current_thread().name == "rank1":
            blocked.set()
        real_block(addr, seen, seconds)
    monkeypatch.setattr(waits, "time", types.SimpleNamespace(sleep=sleep))
    monkeypatch.setattr(futex, "wait", block)
    monkeypatch.setattr(waits, "WATCH_EVERY_S", 20.0)
    store, errors, took = dist.HashStore(), [], []

    def rank_main(rank):
        try:
            with create_communicator("shm", rank, 2, store=store, timeout_s=60) as comm:
                assert comm._futex
                comm._spin = 0     # threads share the GIL: a spinning waiter could outlast the peer's delay
                sig = comm.alloc_window(8, "signal")
                comm.barrier()
                if rank == 0:
                    late_rank_work(comm, sig, blocked)
                else:
                    waiting.set()
                    start = time.monotonic()
                    waiting_rank_work(comm, sig)
                    took.append(time.monotonic() - start)
                    waiting.clear()
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=rank_main, args=(r,), name=f"rank{r}") for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(took) == 1
    assert polled == []            # the wait blocked on its cell: no sleeps
    assert took[0] < 10.0          # woken by the signal, not at the 20 s watch interval
    return took[0]


def _late(then):
    def work(comm, sig, blocked):
        blocked.wait(10)                            # the waiter is past its spin and yields
        time.sleep(0.05)                            # and inside the futex call
        then(comm, sig)
    return work


@pytest.mark.timeout(90)
@pytest.mark.parametrize("op", ["set", "atomic_add"])
def test_a_shm_wait_blocks_on_its_cell_until_the_peers_notify_wakes_it(monkeypatch, op):
    _ranks_as_threads(monkeypatch, _late(lambda comm, sig: comm.notify(sig, 1, 4, 3, op)),
                      lambda comm, sig: comm.wait(sig, 4, 3, "ge"))


@pytest.mark.timeout(90)
def test_a_shm_barrier_blocks_on_the_late_peers_epoch_until_it_arrives(monkeypatch):
    _ranks_as_threads(monkeypatch, _late(lambda comm, sig: comm.barrier()), lambda comm, sig: comm.barrier())


def test_backoff_wait_with_poll_s_keeps_yielding_before_it_blocks(monkeypatch):
    """PYPTO_SHM_POLL_US's polls: past its counted yields a wait with a block yields until poll_s has passed from its
    start, and blocks only after (a blocked waiter may wake long after the signal); without a block, no polls."""
    yields, blocks = [], []
    monkeypatch.setattr(waits, "os", types.SimpleNamespace(sched_yield=lambda: yields.append(1)))
    assert waits.backoff_wait(lambda: len(yields) >= 50, 5.0, spin=0, yields=4, block=blocks.append,
                              poll_s=5.0) is not None
    assert len(yields) == 50 and blocks == []
    yields.clear()
    assert waits.backoff_wait(lambda: len(blocks) >= 1, 5.0, spin=0, yields=4, block=blocks.append) is not None
    assert len(yields) == 4 and len(blocks) == 1                      # poll_s 0 (the default): blocks at once
    yields.clear()
    start = time.monotonic()
    assert waits.backoff_wait(lambda: len(blocks) >= 2, 5.0, spin=0, yields=0, block=blocks.append,
                              poll_s=0.02) is not None
    assert time.monotonic() - start >= 0.02 and len(yields) > 0       # polled its 20 ms, then blocked


def test_shm_poll_us_knob_reads_microseconds_and_rejects_a_negative(monkeypatch):
    from pypto_rt.collective import comm_settings
    from pypto_rt.errors import PyptoError
    monkeypatch.delenv("PYPTO_SHM_POLL_US", raising=False)
    assert comm_settings.shm_poll_s() is None                          # unset: the adaptive policy decides
    monkeypatch.setenv("PYPTO_SHM_POLL_US", "0")
    assert comm_settings.shm_poll_s() == 0.0
    monkeypatch.setenv("PYPTO_SHM_POLL_US", "2500")
    assert comm_settings.shm_poll_s() == pytest.approx(2.5e-3)
    monkeypatch.setenv("PYPTO_SHM_POLL_US", "-1")
    with pytest.raises(PyptoError, match="PYPTO_SHM_POLL_US"):
        comm_settings.shm_poll_s()


def test_backoff_wait_asks_a_callable_poll_s_only_when_its_yields_did_not_do(monkeypatch):
    asked, yields, blocks = [], [], []
    monkeypatch.setattr(waits, "os", types.SimpleNamespace(sched_yield=lambda: yields.append(1)))
    budget = lambda: asked.append(1) or 5.0                                  # noqa: E731
    assert waits.backoff_wait(lambda: len(yields) >= 3, 5.0, spin=0, yields=4, block=blocks.append,
                              poll_s=budget) is not None
    assert asked == []                                                        # the yields did: no policy asked
    assert waits.backoff_wait(lambda: len(yields) >= 60, 5.0, spin=0, yields=4, block=blocks.append,
                              poll_s=budget) is not None
    assert asked == [1] and blocks == []                                      # asked once, polled its budget
