"""What a hang or a failure looks like on the shm backend: deadlines, wait records, aborts, deaths, mismatches."""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from pypto_rt.collective import WAIT_KEYS, list_segments, merge_reports, remove_segments
from tests.collective.harness import new_prefix, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def unsatisfied_rank(ctx):
    with ctx.comm() as comm:
        sig = comm.alloc_window(4 * 4 * ctx.world_size, "signal")
        if ctx.rank == 0:   # nobody ever notifies this cell; rank 1 goes straight to close
            comm.wait(sig, 0, 1, "ge", label="recv", cell=[0, 0], peers=[1])
    return "closed"


@pytest.mark.timeout(60)
def test_unsatisfiable_wait_ends_at_the_deadline_with_a_wait_record():
    outcome = run_ranks(unsatisfied_rank, 2, env={"PYPTO_TIMEOUT_S": "2"})
    assert outcome.elapsed_s < 20   # the 2 s deadline, with room for a loaded host (the harness stops at 30 s)
    err = outcome.errors[0]
    assert err["type"] == "CommTimeoutError"
    w = err["wait"]
    assert set(w) == set(WAIT_KEYS)
    assert (w["rank"], w["op"], w["label"], w["window"], w["cell"], w["seen"], w["expected"], w["cmp"],
            w["peers"]) == (0, "wait", "recv", "signal", [0, 0], 0, 1, "ge", [1])
    assert 1.9 <= w["waited_s"] < 20   # not before its deadline ("for 2.0 s" below names it)
    assert "rank 0 waits in `wait` (label recv) for cell [0, 0] of window 'signal' (seen 0, expected >= 1)" \
           in err["text"] and "for 2.0 s" in err["text"]
    # rank 1 waited in its exit barrier for rank 0, which either timed out too or saw rank 0 abort
    other = outcome.errors[1]
    assert other["type"] in ("CommTimeoutError", "PeerAbortedError")
    assert other["wait"]["op"] == "close" and other["wait"]["peers"] == [0]
    picture = merge_reports([w, other["wait"]])
    assert "rank 0 waits in `wait`" in picture and "rank 1 waits in `close` for rank 0" in picture
    assert "cycle rank 0 -> rank 1 -> rank 0" in picture
    assert outcome.leftovers == []


def raising_rank(ctx):
    with ctx.comm() as comm:
        if ctx.rank == 1:
            raise ValueError("boom on rank 1")
        comm.barrier(label="step")


@pytest.mark.timeout(60)
def test_a_rank_that_raises_makes_its_peers_fail_promptly():
    outcome = run_ranks(raising_rank, 2, env={"PYPTO_TIMEOUT_S": "30"}, deadline_s=20)
    assert outcome.errors[1]["type"] == "ValueError"
    err = outcome.errors[0]
    assert err["type"] == "PeerAbortedError"
    assert "rank 1 aborted (ValueError: boom on rank 1)" in err["text"]
    assert err["wait"]["op"] == "barrier" and err["wait"]["label"] == "step" and err["wait"]["peers"] == [1]
    # noticed, not waited out: the harness ends ranks after 20 s, before the 30 s deadline would have expired
    assert outcome.leftovers == []  # both unlinked their own segments on the way out


def dying_rank(ctx):
    comm = ctx.comm()
    comm.alloc_window(4096, "data")
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.barrier(label="after")


@pytest.mark.timeout(60)
def test_a_rank_that_dies_is_noticed_and_the_launcher_cleanup_removes_its_segments():
    prefix = new_prefix()
    outcome = run_ranks(dying_rank, 2, env={"PYPTO_TIMEOUT_S": "30"}, deadline_s=20, owner_unlinks=False,
                        prefix=prefix)
    assert outcome.errors[1] == {"died": -signal.SIGKILL}
    err = outcome.errors[0]
    assert err["type"] == "PeerAbortedError" and "rank 1 died" in err["text"]   # before the 30 s deadline
    # the launcher owns the segments: the dead rank's (and the survivor's) were left for it; the harness removed
    # them and checked /dev/shm/<prefix>+* is empty
    assert any(name.endswith("-r1") for name in outcome.leftovers)
    assert list_segments(prefix) == []


def mismatched_rank(ctx):
    with ctx.comm() as comm:
        if ctx.rank == 0:
            comm.allreduce(torch.ones(4), label="grad")
        else:
            comm.allgather(torch.empty(2, 4), torch.ones(4))


@pytest.mark.timeout(60)
def test_different_collectives_at_the_same_point_name_both_ranks():
    outcome = run_ranks(mismatched_rank, 2)
    texts = {r: e["text"] for r, e in outcome.errors.items()}
    assert "rank 0 calls allreduce((4,) float32, op=sum) but rank 1 calls allgather((4,) float32)" in texts[0]
    assert "rank 1 calls allgather((4,) float32) but rank 0 calls allreduce((4,) float32, op=sum)" in texts[1]


def same_bytes_rank(ctx, dtypes, shapes):
    with ctx.comm() as comm:
        comm.allreduce(torch.ones(shapes[ctx.rank], dtype=dtypes[ctx.rank]), label="grad")
    return "no error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtypes, shapes, calls", [
    ((torch.int32, torch.float32), ((4, 2), (4, 2)),
     ("allreduce((4, 2) int32, op=sum)", "allreduce((4, 2) float32, op=sum)")),
    ((torch.float32, torch.float32), ((4, 2), (2, 4)),
     ("allreduce((4, 2) float32, op=sum)", "allreduce((2, 4) float32, op=sum)")),
], ids=["dtype", "shape"])
def test_a_collective_of_equal_bytes_but_another_dtype_or_shape_names_both_ranks(dtypes, shapes, calls):
    # without PYPTO_COMM_CHECK: the shm barrier compares the calls themselves, not only their byte counts
    outcome = run_ranks(functools.partial(same_bytes_rank, dtypes=dtypes, shapes=shapes), 2)
    assert set(outcome.errors) == {0, 1}, f"no error, results {outcome.results}"
    for r in (0, 1):
        assert outcome.errors[r]["type"] == "CollectiveMismatchError", outcome.errors[r]
        assert (f"rank {r} calls {calls[r]} but rank {1 - r} calls {calls[1 - r]} at the same point"
                in outcome.errors[r]["text"])


def dtype_mismatch_rank(ctx):
    with ctx.comm() as comm:
        comm.allreduce(torch.ones(4, dtype=torch.float32 if ctx.rank == 0 else torch.int32), label="grad")


@pytest.mark.timeout(60)
def test_comm_check_names_both_ranks_and_calls():
    outcome = run_ranks(dtype_mismatch_rank, 2, env={"PYPTO_COMM_CHECK": "1"})
    for r in (0, 1):
        assert outcome.errors[r]["type"] == "CollectiveMismatchError"
    assert ("collective #0 differs across ranks: rank 0 calls allreduce((4,) float32, op=sum) (label grad) but "
            "rank 1 calls allreduce((4,) int32, op=sum)") in outcome.errors[0]["text"]
    assert "rank 1 calls allreduce((4,) int32, op=sum) (label grad) but rank 0 calls allreduce((4,) float32" \
           in outcome.errors[1]["text"]


def miscounted_rank(ctx):
    with ctx.comm() as comm:
        out = torch.zeros(4, 2)
        recv = [1, 1] if ctx.rank == 0 else [3, 1]   # rank 0 sends rank 1 two rows, not three
        comm.all_to_all_v(out, torch.ones(4, 2), [1, 2] if ctx.rank == 0 else [1, 1], recv)


@pytest.mark.timeout(60)
def test_all_to_all_v_counts_that_disagree_name_both_ranks():
    outcome = run_ranks(miscounted_rank, 2)
    assert "rank 1: all_to_all_v expects 3 rows of 8 bytes from rank 0, but rank 0 sends 2 rows of 8 bytes" \
        in outcome.errors[1]["text"]


def late_rank(ctx):
    if ctx.rank == 1:
        time.sleep(1.5)
        return "late"
    ctx.comm()


@pytest.mark.timeout(60)
def test_start_rendezvous_names_the_ranks_that_never_came():
    outcome = run_ranks(late_rank, 2, env={"PYPTO_START_TIMEOUT_S": "1", "PYPTO_TIMEOUT_S": "30"})
    err = outcome.errors[0]
    assert err["type"] == "CommTimeoutError"
    assert err["wait"]["op"] == "start" and err["wait"]["peers"] == [1]
    assert "raise PYPTO_START_TIMEOUT_S" in err["text"]


LAUNCHED_RANK = textwrap.dedent("""
    import torch
    from pypto_rt.collective import create_communicator
    comm = create_communicator("shm")                 # everything from the launcher's environment
    t = torch.full((3,), float(comm.rank + 1))
    comm.allreduce(t)
    sig = comm.alloc_window(64, "sig")
    comm.notify(sig, 1 - comm.rank, 0, 7, "set")
    comm.wait(sig, 0, 7, "eq")
    comm.close()
    print(comm.prefix, comm.owner_unlinks, t.tolist())
""")


@pytest.mark.timeout(60)
def test_ranks_started_with_the_launcher_environment_leave_cleanup_to_the_launcher():
    prefix = new_prefix()
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           "PYPTO_SHM_PREFIX": prefix, "PYPTO_TIMEOUT_S": "20", "PYTHONPATH": REPO}
    procs = [subprocess.Popen([sys.executable, "-c", LAUNCHED_RANK], env={**env, "RANK": str(r)}, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=45) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert [o[0].split() for o in outs] == [[prefix, "False", "[3.0,", "3.0,", "3.0]"]] * 2
    left = list_segments(prefix)
    assert left and all(name.startswith(prefix + "+c1-") for name in left)   # the launcher's to remove
    assert remove_segments(prefix) == left and list_segments(prefix) == []


UNCLOSED = textwrap.dedent("""
    import torch.distributed as dist
    from pypto_rt.collective import create_communicator, list_segments
    comm = create_communicator("shm", 0, 1, store=dist.HashStore())   # no launcher: it owns its segments' names
    comm.alloc_window(64, "w")
    print(comm.prefix, len(list_segments(comm.prefix)), flush=True)
""")   # (and exits without close())


@pytest.mark.timeout(60)
def test_a_process_that_exits_without_closing_its_own_communicator_leaves_no_segments():
    env = {k: v for k, v in os.environ.items() if k != "PYPTO_SHM_PREFIX"}
    done = subprocess.run([sys.executable, "-c", UNCLOSED], cwd=REPO, env={**env, "PYTHONPATH": REPO},
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    prefix, alive = done.stdout.split()
    assert int(alive) == 2 and list_segments(prefix) == []   # (control and window, there while it ran)
