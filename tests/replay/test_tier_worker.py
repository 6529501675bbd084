"""The compiled tier's background worker (replay.tier_worker): it compiles at the lowest CPU priority, the processes
it starts inherit it, and a process that exits while it works exits cleanly and promptly.

What users depend on: PYPTO_TIER=background is the default, so every job that runs long enough compiles on this
thread; a busy job must keep the cores, and a job must never hang or abort at exit because of a compile."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from pypto_rt.replay import tier_worker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's nice value is Linux's")


@linux_only
def test_the_worker_runs_at_the_lowest_priority_and_the_compiler_it_starts_inherits_it():
    seen, mine = {}, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def job():
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen["child"] = int(subprocess.run(["nice"], capture_output=True, text=True, timeout=30).stdout)
    assert tier_worker.submit(job) and tier_worker.wait_idle(30)
    assert seen == {"thread": tier_worker.IDLE_NICE, "child": tier_worker.IDLE_NICE}, seen
    assert tier_worker.priority == f"at idle priority, nice {tier_worker.IDLE_NICE}"
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine, "the caller's thread was lowered too"


def test_a_refused_priority_change_runs_at_normal_priority_and_says_why(monkeypatch):
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "setpriority", refuse)
    monkeypatch.setattr(sys, "platform", "linux")
    assert tier_worker._lower_priority().startswith("at normal priority (lowering it was refused: ")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert "Linux only; this is darwin" in tier_worker._lower_priority()


IN_TORCH = r"""
import sys, time, torch
sys.path.insert(0, {repo!r})
from pypto_rt.replay import tier_worker
def job():   # (torch's C++ code releases the GIL: the worker is in it when the process exits)
    a = torch.randn(600, 600)
    while True:
        a = (a @ a).tanh()
tier_worker.submit(job)
time.sleep(0.5)
print("EXITING", time.monotonic(), flush=True)
"""


def test_a_process_exiting_while_the_worker_is_in_torch_code_exits_cleanly():
    """Before: the interpreter ended the daemon worker inside torch's C++ frames and the process aborted
    ("terminate called without an active exception", exit status 134)."""
    done = subprocess.run([sys.executable, "-c", IN_TORCH.format(repo=REPO)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0 and "EXITING" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
