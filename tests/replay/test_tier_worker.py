"""The compiled tier's background worker (replay.tier_worker): it keeps the caller's priority (the compile process
has the lowest), and a process that exits while it works exits cleanly and promptly.

What users depend on: PYPTO_TIER=background is the default, so every job that runs long enough compiles on this
thread; a busy job must keep the cores, and a job must never hang or abort at exit because of a compile."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from pypto_rt.replay import tier_worker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_worker_keeps_the_callers_priority():
    """The compile runs in the compile process at nice 19 (replay.tier_process); the worker only waits for it, then
    loads and checks the code. Before, the worker ran at nice 19 itself: preempted while holding the interpreter
    lock for that short part, it stalled the calling thread (0.65-1.0 s against 0.09 s, bench.tier_priority)."""
    seen, mine = {}, os.getpriority(os.PRIO_PROCESS, os.getpid())

    def job():
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert tier_worker.submit(job) and tier_worker.wait_idle(30)
    assert seen == {"thread": mine}, seen


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
