"""The torch.distributed (gloo) communicator on forked ranks: the same collective checks as shm, and its limits."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pypto_rt.errors import NotSupportedError
from tests.collective.harness import run_ranks
from tests.collective.test_shm_collectives import a2av_rank, collectives_rank

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Gloo:
    """Wraps a rank context so the shared rank functions build a gloo communicator."""

    def __init__(self, ctx):
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def comm(self, **options):
        return self._ctx.comm("gloo", **options)


@pytest.mark.timeout(60)
def test_gloo_collectives_match_torch_references():
    outcome = run_ranks(lambda ctx: (collectives_rank(Gloo(ctx)), a2av_rank(Gloo(ctx))), 2)
    assert outcome.ok() == {0: ("ok", "ok"), 1: ("ok", "ok")}


def no_windows_rank(ctx):
    with ctx.comm("gloo") as comm:
        assert comm.backend == "gloo"
        try:
            comm.alloc_window(64)
        except NotSupportedError as e:
            return e.message, e.hint


@pytest.mark.timeout(60)
def test_gloo_has_no_windows_and_says_what_to_use():
    message, hint = run_ranks(no_windows_rank, 2).ok()[0]
    assert message == "the gloo communicator cannot do alloc_window (no shared windows)"
    assert hint == "windows, signals and one-sided ops need backend 'shm' (ranks on one host)"


def _threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def closing_rank(ctx):
    before = _threads()
    comm = ctx.comm("gloo")
    temporary = torch.ones(4)
    comm.allreduce(temporary)
    del temporary   # the collective's worker may still hold it: the race that aborted ranks at exit
    during = _threads() - before
    comm.close()
    return bool(during), sorted(_threads() & during)


@pytest.mark.timeout(60)
def test_gloo_close_ends_the_groups_threads_before_interpreter_exit():
    """gloo's worker threads end with the group's last reference; one ending during interpreter teardown aborts
    the rank (SIGABRT, "terminate called without an active exception") after its program passed."""
    assert run_ranks(closing_rank, 2).ok() == {0: (True, []), 1: (True, [])}


UNCLOSED = textwrap.dedent("""
    import atexit, os, torch
    from pypto_rt.collective import create_communicator
    threads = lambda: len(os.listdir("/proc/self/task"))
    before = threads()
    atexit.register(lambda: print("threads at exit", threads() - before))   # runs after the communicator's hook
    comm = create_communicator("gloo", 0, 1)
    comm.allreduce(torch.ones(4))
    print("threads while open", threads() - before)
""")


@pytest.mark.timeout(60)
def test_an_unclosed_gloo_communicator_is_destroyed_at_exit_before_teardown():
    done = subprocess.run([sys.executable, "-c", UNCLOSED], capture_output=True, text=True, timeout=50, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] != "threads while open 0" and lines[1] == "threads at exit 0", lines


def skipping_rank(ctx):
    with ctx.comm("gloo") as comm:
        if ctx.rank == 0:
            comm.allreduce(torch.ones(4), label="grad")
        else:
            comm.barrier(label="elsewhere")   # a different collective: gloo pairs them up or times out


def stuck_rank(ctx):
    with ctx.comm("gloo") as comm:
        if ctx.rank == 0:
            comm.allreduce(torch.ones(4), label="grad")
        else:
            import time
            time.sleep(1.5)


@pytest.mark.timeout(60)
def test_gloo_timeout_becomes_a_wait_record():
    outcome = run_ranks(stuck_rank, 2, env={"PYPTO_TIMEOUT_S": "1"})
    err = outcome.errors[0]
    assert err["type"] == "CommTimeoutError", err
    assert (err["wait"]["rank"], err["wait"]["op"], err["wait"]["label"]) == (0, "allreduce", "grad")
    assert 0.9 <= err["wait"]["waited_s"] < 2.5


@pytest.mark.timeout(60)
def test_comm_check_catches_what_gloo_would_pair_up():
    outcome = run_ranks(skipping_rank, 2, env={"PYPTO_COMM_CHECK": "1"})
    assert outcome.errors[0]["type"] == "CollectiveMismatchError"
    assert "rank 0 calls allreduce((4,) float32, op=sum) (label grad) but rank 1 calls barrier()" \
        in outcome.errors[0]["text"]


NCCL_RANK = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from pypto_rt.collective import create_communicator
    cuda = torch.device("cuda")
    with create_communicator("nccl", 0, 1, store=dist.HashStore()) as comm:
        t = torch.arange(4.0, device=cuda)
        comm.allreduce(t, "max", label="one gpu")
        gathered = torch.empty(1, 4, device=cuda)
        comm.allgather(gathered, t)
        out = torch.full((5, 2), -1.0, device=cuda)
        comm.all_to_all_v(out, torch.arange(10.0, device=cuda).view(5, 2), [3], [3])
        comm.barrier()
        comm.broadcast(t, 0)
        rs = torch.empty(4, device=cuda)
        comm.reduce_scatter(rs, t)
        assert torch.equal(gathered[0], t) and torch.equal(rs, t)
        assert out[:3].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]] and out[3:].eq(-1).all()
    print("ok")
""")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (nccl)")
def test_nccl_collectives_on_one_gpu():
    # a fresh interpreter: CUDA cannot start in a process forked from one that probed it
    done = subprocess.run([sys.executable, "-c", NCCL_RANK], capture_output=True, text=True, timeout=100, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "ok"
