"""The compiled tier's compile process (replay.tier_process, replay.tier_child, replay.tier_request): what a build
sends there, and that the child never outlives its parent.

What users depend on: a job killed outright (SIGKILL: no atexit runs) leaves no compile running on the machine."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from pypto_rt.replay import tier_request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scaled(a, b):
    return (torch.ops.aten.add.Tensor(a, b) * torch.tensor(2.0),)


def test_a_request_carries_the_function_with_its_operators_and_modules_by_name():
    """Aten operators and modules do not pickle: they travel by name and come back as themselves."""
    import io

    examples = [torch.randn(2, 3)]
    examples.append(examples[0][1:])   # (a view: it stays one)
    request = tier_request.request(_scaled, None, examples, (), 1, ("tests.replay.tier_hooks:spoiling", ()))
    buffer = io.BytesIO()
    torch.save(request, buffer)
    buffer.seek(0)
    back = torch.load(buffer, weights_only=False)
    fn = tier_request.function(back)
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(fn(a, b)[0], _scaled(a, b)[0])
    assert fn.__globals__["torch"] is torch
    x, view = back["examples"]
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and view.storage_offset() == 3
    assert tier_request.preparer(back["prepare"]).func.__name__ == "spoiling"


def test_a_refused_priority_change_runs_at_normal_priority_and_says_why(monkeypatch):
    from pypto_rt.replay import tier_child

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "setpriority", refuse)
    assert tier_child._lower_priority(19).startswith("at normal priority (lowering it was refused: ")


KILLED = r"""
import sys, threading, time, torch
sys.path.insert(0, {repo!r})
from pypto_rt.replay import tier_process
def body(a):
    return (a + 1,)
def build():
    try:
        tier_process.compile_apart(body, None, [torch.randn(2, 2)], (), 1, ("tests.replay.tier_hooks:stall", ()),
                                   time.perf_counter() + 600, True)
    except Exception:
        pass
threading.Thread(target=build, daemon=True).start()
while tier_process._slots[True].child is None:
    time.sleep(0.05)
print("CHILD", tier_process._slots[True].child.process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")   # (a zombie has ended)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.timeout(200)
def test_a_killed_job_leaves_no_compile_process_running():
    job = subprocess.Popen([sys.executable, "-c", KILLED.format(repo=REPO)], stdout=subprocess.PIPE, text=True,
                           cwd=REPO)
    try:
        line = job.stdout.readline()
        child = int(line.split()[1])
        time.sleep(1.0)
        assert _alive(child), "the compile process did not start"
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(30)
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the compile process outlived its killed parent"


def _doubled_into(a, b):
    b[:, :] = a * 2 + 1
    return (b,)


@pytest.mark.timeout(300)
def test_a_graph_of_dynamic_sizes_built_apart_serves_other_sizes_and_checks_what_it_assumed():
    """replay.tier_family's graph goes through the compile process too: the dims to make symbolic travel in the
    request, and what inductor assumed of the sizes comes back as source text, checked here."""
    from pypto_rt.replay import tier_process

    x, out = torch.randn(6, 8), torch.empty(6, 8)
    _, direct, assumed, _ = tier_process.compile_apart(
        _doubled_into, None, [x, out], (), 1, ("pypto_rt.replay.tier:_unjoined", ()), time.perf_counter() + 240,
        False, {0: {0}, 1: {0}})
    assert direct is not None and assumed is not None
    for rows in (3, 9):   # sizes it was not built at
        a, b = torch.randn(rows, 8), torch.empty(rows, 8)
        assert assumed([a, b])
        direct([a, b])
        assert torch.equal(b, a * 2 + 1), rows
    assert not assumed([torch.randn(1, 8), torch.empty(1, 8)])   # (traced assuming the row count is not 1)
    assert not assumed([torch.randn(4, 8), torch.empty(5, 8)])   # (nor that a's and b's row counts differ)


@pytest.mark.timeout(300)
def test_a_graph_of_dynamic_sizes_builds_for_arguments_that_are_views_into_larger_memory():
    """Serving engines pass views (the first rows of a persistent buffer, a slice of a pool): the view's base keeps
    its sizes, so what the build assumed names only the graph's inputs (a base with sizes of its own raised an
    IndexError in produce_guards), and the compiled calls, direct and through compile_fx's wrappers, give the
    replay's results at other sizes and offsets."""
    from pypto_rt.replay import tier_process

    pool, persistent = torch.randn(40, 16), torch.zeros(64, 24)
    x, out = pool[3:9, 4:12], persistent[:6, 8:16]   # (strided views at offsets)
    wrapped, direct, assumed, _ = tier_process.compile_apart(
        _doubled_into, None, [x, out], (), 1, ("pypto_rt.replay.tier:_unjoined", ()), time.perf_counter() + 240,
        False, {0: {0}, 1: {0}})
    assert direct is not None and assumed is not None
    for rows in (3, 11):
        for run in (direct, lambda inputs: wrapped(*inputs)):
            a, b = pool[3:3 + rows, 4:12], persistent[:rows, 8:16]
            assert assumed([a, b])
            b.zero_()
            run([a, b])
            assert torch.equal(b, a * 2 + 1), rows
            assert torch.equal(persistent[rows:], torch.zeros(64 - rows, 24)), rows   # (nothing past the view)


SHORT_LIVED = r"""
import sys, threading, time, torch
sys.path.insert(0, {repo!r})
from pypto_rt.replay import tier_process
def body(a):
    return (a + 1,)
def build():
    tier_process.compile_apart(body, None, [torch.randn(2, 2)], (), 1, ("pypto_rt.replay.tier:_unjoined", ()),
                               time.perf_counter() + 240, False)
first = threading.Thread(target=build)   # (as a pool's or a server's request thread: it ends after its compile)
first.start()
first.join()
child = tier_process._slots[False].child.process
time.sleep(1.0)   # (a parent-death signal is sent as the thread ends)
print("ALIVE", child.poll() is None, flush=True)
build()   # the next compile, from another thread, uses the same child
print("SAME", tier_process._slots[False].child.process is child, child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.timeout(300)
def test_a_compile_process_started_by_a_thread_that_ended_lives_on_and_dies_with_its_process():
    """Linux sends the parent-death signal when the thread that started the child ends: the children are started
    by a thread of the process's own, so a compile asked for by a short-lived thread leaves a child the next
    compile uses, and killing the process still leaves none."""
    job = subprocess.Popen([sys.executable, "-c", SHORT_LIVED.format(repo=REPO)], stdout=subprocess.PIPE, text=True,
                           cwd=REPO)
    child = None
    try:
        assert job.stdout.readline().split() == ["ALIVE", "True"], "the compile process died with the thread"
        same, reused, pid = job.stdout.readline().split()
        child = int(pid)
        assert reused == "True", "the next compile started a fresh compile process"
        assert _alive(child)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(30)
    deadline = time.monotonic() + 30
    while child is not None and _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child is not None and not _alive(child), "the compile process outlived its killed parent"


@pytest.mark.timeout(300)
def test_a_graph_of_dynamic_sizes_assumes_its_inputs_sharing_memory_do_not_overlap_and_checks_it():
    """Inputs in one memory (a pool's rows, read and written): the graph was built for them apart; a size at which
    they overlap fails its check (the replay's or its own graph's course), where the compiled code was wrong."""
    from pypto_rt.replay import tier_process
    from pypto_rt.replay.tier_copies import copy

    pool = torch.randn(40, 8)
    _, direct, assumed, _ = tier_process.compile_apart(
        _doubled_into, None, copy([pool[0:6], pool[10:16]]), (), 1, ("pypto_rt.replay.tier:_unjoined", ()),
        time.perf_counter() + 240, False, {0: {0}, 1: {0}})
    apart = torch.randn(40, 8)
    want = apart.clone()
    _doubled_into(want[0:8], want[10:18])
    assert assumed([apart[0:8], apart[10:18]])
    direct([apart[0:8], apart[10:18]])
    assert torch.equal(apart, want)
    assert not assumed([pool[0:12], pool[10:22]])   # (rows 10 and 11 are in both)


def test_a_compile_process_whose_start_the_caller_gave_up_on_is_killed(monkeypatch):
    """A start slower than START_WAIT_S fails the compile (the replay stays) and leaves no child behind, whether
    it arrives just before the caller gives up or after."""
    import threading

    from pypto_rt.replay import tier_process

    killed, started = [], threading.Event()

    class SlowChild:
        def __init__(self, nice):
            started.set()
            time.sleep(0.3)

        def kill(self):
            killed.append(self)

        def forget(self):
            pass

    monkeypatch.setattr(tier_process, "_Child", SlowChild)
    monkeypatch.setattr(tier_process, "START_WAIT_S", 0.05)
    starter = tier_process._Starter()
    with pytest.raises(tier_process.CompileFailed, match="not started within"):
        starter.start(0)
    assert started.is_set()
    deadline = time.monotonic() + 10
    while not killed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(killed) == 1, "the child started for a caller that gave up was left running"
