"""The engine on healthy runs: ordering from the tensor map, concurrency, explicit deps, scopes, SPMD, host waits."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from pypto_rt import config
from pypto_rt.aicpu import TaskAccess, Engine, StallError, region_of


def _write(view, value, delay=0.0):
    def run(block):
        time.sleep(delay)
        view.fill_(value)
    return run


def _copy(dst, src, delay=0.0):
    def run(block):
        time.sleep(delay)
        dst.copy_(src)
    return run


def test_raw_reader_sees_the_slow_writers_data():
    x, y = torch.zeros(8, 4), torch.zeros(4, 4)
    with Engine(num_workers=2) as e:
        w = e.submit("write", _write(x[0:4], 1.0, delay=0.1), [TaskAccess(region_of(x, (0, None), (4, None)), "w")])
        r = e.submit("read", _copy(y, x[0:4]), [TaskAccess(region_of(x, (2, None), (2, None)), "r"),
                                               TaskAccess(region_of(y), "w")])
        e.finish()
    assert torch.all(y == 1)
    assert r.deps == [(w, "RAW")]


def test_waw_keeps_submission_order():
    x = torch.zeros(4)
    with Engine(num_workers=2) as e:
        e.submit("first", _write(x, 1.0, delay=0.1), [TaskAccess(region_of(x), "w")])
        e.submit("second", _write(x, 2.0), [TaskAccess(region_of(x), "w")])
        e.finish()
    assert torch.all(x == 2)


def test_war_writer_waits_for_the_slow_reader():
    x, y = torch.ones(4), torch.zeros(4)
    with Engine(num_workers=2) as e:
        e.submit("read", _copy(y, x, delay=0.1), [TaskAccess(region_of(x), "r"), TaskAccess(region_of(y), "w")])
        e.submit("overwrite", _write(x, 5.0), [TaskAccess(region_of(x), "w")])
        e.finish()
    assert torch.all(y == 1) and torch.all(x == 5)


def test_independent_tasks_run_concurrently_on_two_workers():
    barrier = threading.Barrier(2)
    with Engine(num_workers=2) as e:
        tasks = [e.submit(f"meet{i}", lambda b: barrier.wait(timeout=5)) for i in range(2)]
        e.finish()
    assert all(t.state == "done" for t in tasks)


def test_explicit_deps_and_dummy_joins():
    order = []
    with Engine(num_workers=2) as e:
        a = e.submit("a", lambda b: (time.sleep(0.05), order.append("a")))
        b = e.submit("b", lambda b: (time.sleep(0.1), order.append("b")))
        join = e.dummy([a, None, b])
        c = e.submit("c", lambda b: order.append("c"), deps=[join])
        e.finish()
    assert order[-1] == "c" and sorted(order[:2]) == ["a", "b"]
    assert join.run is None and join.state == "done" and [kind for _, kind in c.deps] == ["dep"]
    assert e.stats["dummy_tasks"] == 1 and e.stats["edges"]["explicit"] == 3


def test_finished_deps_are_skipped():
    with Engine(num_workers=2) as e:
        a = e.submit("a", lambda b: None)
        e.wait([a])
        c = e.submit("c", lambda b: None, deps=[a])
        e.finish()
    assert c.deps == []


def test_manual_scope_ignores_the_tensor_map_but_honours_deps():
    x, y, z = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    with Engine(num_workers=2) as e:
        with e.scope("manual", manual=True):
            w = e.submit("write", _write(x, 3.0, delay=0.1), [TaskAccess(region_of(x), "w")])
            blind = e.submit("blind", lambda b: None, [TaskAccess(region_of(x), "r")])
            ordered = e.submit("ordered", _copy(y, x), [TaskAccess(region_of(x), "r")], deps=[w])
        after = e.submit("after", _copy(z, x), [TaskAccess(region_of(x), "r"), TaskAccess(region_of(z), "w")])
        e.finish()
    assert blind.deps == [] and ordered.deps == [(w, "dep")]
    assert torch.all(y == 3) and torch.all(z == 3)
    assert (w, "RAW") in after.deps or w.t_end <= after.t_submit


def test_spmd_blocks_all_run_and_result_is_block_zeros():
    seen = set()
    with Engine(num_workers=2) as e:
        t = e.submit("spmd", lambda b: (seen.add(b), b * 10 + 7)[1], blocks=5)
        e.finish()
    assert seen == set(range(5)) and t.result == 7 and len(t.slices) == 5


def test_host_waits_for_exactly_the_overlapping_writers():
    x = torch.zeros(8, 4)
    release = threading.Event()
    with Engine(num_workers=2) as e:
        slow = e.submit("slow", lambda b: release.wait(5), [TaskAccess(region_of(x, (4, None), (4, None)), "w")])
        fast = e.submit("fast", _write(x[0:4], 2.0, delay=0.05), [TaskAccess(region_of(x, (0, None), (4, None)), "w")])
        e.wait_region(region_of(x, (0, None), (4, None)))
        assert fast.state == "done" and slow.state in ("ready", "running") and torch.all(x[0:4] == 2)
        release.set()
        e.wait([slow])
        e.finish()


def test_knobs_come_from_config():
    with config.scope(NUM_WORKERS="2", RING_SIZE="16", TIMEOUT_S="7"):
        with Engine() as e:
            assert (e.num_workers, e.ring_size, e.timeout_s) == (2, 16, 7.0)
            e.finish()


def test_ring_back_pressure_with_a_scope_per_task():
    x = torch.zeros(64)
    with Engine(num_workers=2, ring_size=2) as e:
        for i in range(64):
            with e.scope("body"):
                e.submit("step", _write(x[i:i + 1], float(i), delay=0.001),
                         [TaskAccess(region_of(x, (i,), (1,)), "w")])
        e.finish()
    assert torch.equal(x, torch.arange(64, dtype=torch.float32))
    assert e.stats["ring_high_water"] == 2


def test_workers_set_their_own_torch_thread_count_and_leave_the_hosts_alone():
    host_threads = torch.get_num_threads()
    with Engine(num_workers=2) as e:
        t = e.submit("threads", lambda b: torch.get_num_threads())
        e.finish()
    assert t.result == max(1, (os.cpu_count() or 1) // 2)
    assert torch.get_num_threads() == host_threads


class _Asleep:
    """A pool whose workers never hear of queued blocks: only the host can run them."""
    def __init__(self, pool):
        self.size, self.torch_threads = pool.size, pool.torch_threads
        self.queue = type("NoQueue", (), {"put": staticmethod(lambda token: None)})()


def test_the_final_join_runs_an_unclaimed_block_itself_while_a_worker_is_idle():
    ran_on = []
    with config.scope(HOST_INLINE_US="200"):
        with Engine(num_workers=1, timeout_s=5) as e:
            e._pool = _Asleep(e._pool)     # the idle worker is "still waking up" for the whole run
            e.submit("lone", lambda b: ran_on.append(threading.get_ident()))
            e.finish()
    assert ran_on == [threading.get_ident()]


def test_the_host_leaves_queued_blocks_to_busy_workers_beyond_their_number():
    # two queued blocks, one (sleeping) worker: the host taking one would run two at once, so it must not
    with config.scope(HOST_INLINE_US="200"):
        e = Engine(num_workers=1, timeout_s=1)
        try:
            e._pool = _Asleep(e._pool)
            e.submit("a", lambda b: None)
            e.submit("b", lambda b: None)
            with pytest.raises(StallError):   # nobody ran them: the host did not help out
                e.finish()
        finally:
            e.close()


def test_the_heap_padding_knob_is_applied_once_and_a_bad_value_says_which_knob():
    # in a process of its own: the first engine of a process reads the knob (a malformed value fails every
    # engine until one applies a good value), later engines do not ask again
    code = """if True:
        from pypto_rt import config
        from pypto_rt.aicpu import Engine
        from pypto_rt.errors import PyptoError
        for raw in ("lots", "64", "lots"):
            with config.scope(HEAP_PAD_MB=raw):
                try:
                    Engine(num_workers=1).close()
                    print(raw, "ok")
                except PyptoError as e:
                    print(raw, "error", " ".join(str(e).split()))
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYPTO_HEAP_PAD_MB"})
    assert done.returncode == 0, done.stderr
    bad, good, again = done.stdout.splitlines()
    assert bad.startswith("lots error") and "PYPTO_HEAP_PAD_MB='lots' must be an integer" in bad
    assert (good, again) == ("64 ok", "lots ok")


def test_a_worker_keeps_its_thread_count_when_the_host_sets_another_before_the_workers_first_op():
    """torch sets a thread's count lazily from the last count any thread set: a worker must not take the host's
    (a block's results would then depend on which thread ran it)."""
    from pypto_rt.aicpu.workers import WorkerPool

    class Item:
        def __init__(self, body):
            self.body, self.done = body, threading.Event()

        def run_queued(self, lane):
            self.result = self.body()
            self.done.set()

    host = torch.get_num_threads()
    pool = WorkerPool(1, 1)
    try:
        started = Item(lambda: None)   # (no torch call: the worker has set its count and asked nothing yet)
        pool.queue.put(started)
        assert started.done.wait(10)
        torch.set_num_threads(2)
        asked = Item(torch.get_num_threads)
        pool.queue.put(asked)
        assert asked.done.wait(10)
        assert asked.result == 1
    finally:
        torch.set_num_threads(host)
        pool.stop()


def test_starting_the_workers_leaves_the_host_threads_count_as_torch_chose_it():
    """A fresh process whose first torch work comes after the workers started keeps torch's own count on its main
    thread (a worker's count must not become the host's: the user's own torch code would run on one thread)."""
    import subprocess
    import sys

    code = ("import time, torch\nfrom pypto_rt.aicpu.workers import WorkerPool\npool = WorkerPool(1, 1)\n"
            "time.sleep(0.3)\nprint(torch.get_num_threads())\n")
    default = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, timeout=120)
    after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr
    assert after.stdout.split() == default.stdout.split()
