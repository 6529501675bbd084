"""The engine when things go wrong: kernel failures, poisoning, stalls, rings that cannot drain."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from pypto_rt.aicpu import (TaskAccess, Engine, RingOverflowError, StallError, TaskFailedError, TaskPoisoned,
                            region_of)
from pypto_rt.errors import PyptoError, Span


def _boom(block):
    time.sleep(0.05)
    raise ValueError("boom")


def test_failure_poisons_dependants_and_finish_names_the_task():
    x = torch.zeros(4)
    span = Span("kernel.py", 12)
    with Engine(num_workers=2) as e:
        bad = e.submit("bad", _boom, [TaskAccess(region_of(x), "w")], span=span)
        reader = e.submit("reader", lambda b: None, [TaskAccess(region_of(x), "r")])
        after = e.submit("after", lambda b: None, deps=[reader])
        with pytest.raises(TaskFailedError) as info:
            e.finish()
    err = info.value
    assert err.message == "task 'bad' (#0) failed: ValueError: boom"
    assert err.task is bad and isinstance(err.__cause__, ValueError) and err.span == span
    for task, producer in ((reader, bad), (after, reader)):
        assert task.state == "failed" and isinstance(task.error, TaskPoisoned) and task.error.producer is producer


def test_the_next_host_call_raises_and_a_pypto_error_keeps_its_span():
    inner = Span("kernel.py", 3)

    def fail(block):
        raise PyptoError("bad tile", inner)

    with Engine(num_workers=2) as e:
        t = e.submit("k", fail, span=Span("prog.py", 9))
        with pytest.raises(TaskFailedError) as info:
            e.wait([t])
        assert info.value.span == inner and "failed: bad tile" in info.value.message
        with pytest.raises(TaskFailedError):
            e.submit("later", lambda b: None)


def test_queued_tasks_are_dropped_after_a_failure():
    ran = []
    with Engine(num_workers=1) as e:
        e.submit("bad", _boom)
        rest = [e.submit(f"t{i}", lambda b, i=i: ran.append(i)) for i in range(5)]
        with pytest.raises(TaskFailedError):
            e.finish()
        e.close()
    assert ran == [] and all(t.state == "failed" for t in rest)


def test_stuck_task_raises_a_stall_report_naming_it_and_its_waiter():
    never = threading.Event()
    e = Engine(num_workers=2, timeout_s=1)
    try:
        stuck = e.submit("stuck", lambda b: never.wait(), span=Span("prog.py", 4))
        e.submit("waiter", lambda b: None, deps=[stuck])
        start = time.monotonic()
        with pytest.raises(StallError) as info:
            e.finish()
        assert time.monotonic() - start < 30   # its 1 s deadline, not the 300 s default (generous: loaded hosts)
    finally:
        e.close()
        never.set()
    text = info.value.message
    assert "1 running, 0 ready, 1 waiting" in text
    assert "task 'stuck' (#0) at prog.py:4:1: running for" in text
    assert "task 'waiter' (#1): waiting for 'stuck' (#0) (running)" in text


def test_a_block_stuck_on_the_host_thread_ends_in_the_stall_report_in_a_process_that_ignores_sigint():
    """A background job of a non-interactive shell starts with SIGINT ignored, where the watchdog's SIGINT would be
    lost: it interrupts the host thread with a signal of its own there, so the stuck block still ends."""
    code = textwrap.dedent("""
        import threading
        from pypto_rt.aicpu import Engine, StallError
        never = threading.Event()
        e = Engine(num_workers=1, timeout_s=1, inline=True)     # every block on the host thread
        try:
            e.submit("stuck", lambda b: never.wait())
            e.finish()
        except StallError as error:
            print("stalled:", error.message.splitlines()[0])
        finally:
            e.close()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr
    assert "stalled: " in proc.stdout and "made no progress" in proc.stdout, proc.stdout + proc.stderr


def test_a_run_after_a_stuck_run_gets_fresh_workers():
    never = threading.Event()
    e = Engine(num_workers=2, timeout_s=1)
    e.submit("stuck", lambda b: never.wait())
    e.submit("stuck too", lambda b: never.wait())
    with pytest.raises(StallError):
        e.finish()
    e.close()
    try:
        barrier = threading.Barrier(2)
        with Engine(num_workers=2, timeout_s=5) as fresh:
            for i in range(2):
                fresh.submit(f"meet{i}", lambda b: barrier.wait(timeout=5))
            fresh.finish()
    finally:
        never.set()


def test_ring_that_can_never_drain_raises_at_once():
    with Engine(num_workers=2, ring_size=2) as e:
        with e.scope("loop body", span=Span("prog.py", 7)):
            done = [e.submit(f"t{i}", lambda b: None) for i in range(2)]
            e.wait(done)
            start = time.monotonic()
            with pytest.raises(RingOverflowError) as info:
                e.submit("t2", lambda b: None)
            assert time.monotonic() - start < 5   # at once, not after a stall deadline (generous: loaded hosts)
    err = info.value
    assert "scope 'loop body' at prog.py:7:1 holds 2 tasks" in err.message and "(2 slots)" in err.message
    assert "PYPTO_RING_SIZE" in err.hint and err.span == Span("prog.py", 7)


def test_a_task_run_now_counts_holds_its_ring_slot_and_fails_the_run_like_any_task():
    with Engine(num_workers=2, ring_size=2) as e:
        with e.scope("loop body", span=Span("prog.py", 3)):
            first = e.run_now("first", lambda b: 7 + b)
            assert (first.state, first.result) == ("done", 7)
            e.run_now("second", lambda b: None)
            with pytest.raises(RingOverflowError):   # done, but its scope holds it: a third can never fit
                e.run_now("third", lambda b: None)
        failed = e.run_now("broken", lambda b: 1 / 0, span=Span("prog.py", 9))
        assert failed.state == "failed"
        with pytest.raises(TaskFailedError) as info:   # as for a task on a worker: the next submit reports it
            e.submit("after", lambda b: None)
        with pytest.raises(TaskFailedError):
            e.finish()
    assert "'broken'" in str(info.value) and info.value.span == Span("prog.py", 9)
    assert e.stats["tasks"] == 3 and e.stats["ring_high_water"] == 2


def test_run_now_leaves_traced_runs_to_submit(tmp_path):
    with Engine(num_workers=1, trace_path=str(tmp_path / "t.json")) as e:
        assert e.run_now("traced", lambda b: None) is None
        e.finish()
