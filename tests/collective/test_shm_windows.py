"""shm windows: zeroed symmetric allocation, int32 signals (set / atomic add / wait), one-sided access."""
from __future__ import annotations

import threading

import pytest
import torch

from pypto_rt.collective import create_communicator, list_segments
from pypto_rt.errors import PyptoError
from tests.collective.harness import run_ranks


def windows_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    with ctx.comm() as comm:
        sig = comm.alloc_window(64, "signal")
        # a peer may signal the moment its own alloc_window returns: nothing zeroes this rank's cells after that
        comm.notify(sig, (me + 1) % w, 4, 1, "set")
        data = comm.alloc_window(5000, "data")
        assert sig.nbytes == 64 and data.nbytes == 5000
        assert data.local.shape == (5000,) and data.local.dtype == torch.uint8
        assert int(data.local.sum()) == 0 and all(int(data.peer(r).sum()) == 0 for r in range(w))
        assert comm.wait(sig, 4, 1, "eq", label="early") == 1
        # the views are the peers' live memory
        comm.barrier()
        data.local[:4].view(torch.int32)[0] = 100 + me
        comm.barrier()
        assert [int(data.peer(r)[:4].view(torch.int32)[0]) for r in range(w)] == [100 + r for r in range(w)]
    return "ok"


def atomic_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    n = 150
    with ctx.comm() as comm:
        sig = comm.alloc_window(4 * w, "counter")

        def hammer():
            for i in range(n):
                for p in range(w):
                    comm.notify(sig, p, 0, 1, "atomic_add")       # every rank and thread adds into cell 0 of all
                comm.notify(sig, 0, 4 * (1 + me % (w - 1)), 2, op="AtomicAdd")
        threads = [threading.Thread(target=hammer) for _ in range(2)]   # two threads share this communicator
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = w * 2 * n
        assert comm.wait(sig, 0, total, "ge", label="all adds") == total
        comm.barrier()
        assert comm.wait(sig, 0, total, "eq") == total   # no add lost, none doubled
        if me == 0:
            cells = sig.local.view(torch.int32).tolist()
            assert sum(cells[1:]) == w * 2 * n * 2
    return "ok"


def one_sided_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    with ctx.comm() as comm:
        win = comm.alloc_window(4 * 16 * w, "buf")
        acc = comm.alloc_window(4 * 8, "acc")
        mine = torch.arange(16, dtype=torch.float32) + 100 * me
        comm.remote_store(win, (me + 1) % w, 64 * me, mine)                # into the next rank, at my slot
        comm.put(acc, 0, 0, torch.full((8,), float(me + 1)), atomic_add=True)
        comm.barrier()
        prev = (me - 1) % w
        local = win.local.view(torch.float32).view(w, 16)
        assert torch.equal(local[prev], torch.arange(16, dtype=torch.float32) + 100 * prev)
        got = comm.remote_load(win, (me + 1) % w, 64 * me, 64, dtype=torch.float32, shape=(4, 4))
        assert torch.equal(got, mine.view(4, 4))
        got[0, 0] = -1                                                     # a copy, not a view
        assert comm.remote_load(win, (me + 1) % w, 64 * me, 4, dtype=torch.float32)[0] == mine[0]
        dst = torch.empty(8)
        comm.get(acc, 0, 0, dst)
        assert torch.equal(dst, torch.full((8,), float(sum(range(1, w + 1)))))
        comm.barrier()
        comm.remote_store(acc, 0, 0, torch.ones(2, dtype=torch.float32), atomic_add=True)
        comm.barrier()
        assert comm.remote_load(acc, 0, 0, 8, dtype=torch.float32).tolist() == [sum(range(1, w + 1)) + w] * 2
    return "ok"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
def test_windows_are_zeroed_symmetric_and_live(world):
    outcome = run_ranks(windows_rank, world)
    assert outcome.ok() == {r: "ok" for r in range(world)} and outcome.leftovers == []


@pytest.mark.timeout(60)
def test_concurrent_atomic_adds_from_ranks_and_threads_are_exact():
    outcome = run_ranks(atomic_rank, 4)
    assert outcome.ok() == {r: "ok" for r in range(4)} and outcome.leftovers == []


@pytest.mark.timeout(60)
def test_remote_load_store_put_get_and_atomic_store():
    outcome = run_ranks(one_sided_rank, 2)
    assert outcome.ok() == {0: "ok", 1: "ok"} and outcome.leftovers == []


def test_single_rank_argument_errors_and_cleanup():
    comm = create_communicator("shm", 0, 1)
    prefix = comm.prefix
    assert list_segments(prefix)
    win = comm.alloc_window(16, "sig")
    with pytest.raises(PyptoError, match="outside window 'sig'"):
        comm.notify(win, 0, 16, 1)
    with pytest.raises(PyptoError, match="multiple of 4"):
        comm.wait(win, 2, 0)
    with pytest.raises(PyptoError, match="peer 3, outside world size 1"):
        comm.remote_load(win, 3, 0, 4)
    with pytest.raises(PyptoError, match="notify op 'or' is not one of set, atomic_add"):
        comm.notify(win, 0, 0, 1, "or")
    comm.notify(win, 0, 0, 2**31 - 1, "set")
    comm.notify(win, 0, 0, 1)                       # int32 wraps like the hardware's atomic add
    assert win.local.view(torch.int32)[0] == -2**31
    kept = win.local                               # a view kept past close stays valid memory
    comm.close()
    assert list_segments(prefix) == []             # no launcher: this communicator owned its segments
    assert kept.view(torch.int32)[0] == -2**31
    with pytest.raises(PyptoError, match="closed communicator"):
        comm.barrier()


@pytest.mark.timeout(60)
def test_ranks_as_threads_of_one_process_share_windows():
    """The host form runs one thread per rank in one process: a HashStore and one communicator per thread."""
    import torch.distributed as dist
    store, world, errors, totals, prefix = dist.HashStore(), 3, [], {}, []

    def rank_main(rank):
        try:
            with create_communicator("shm", rank, world, store=store) as comm:
                sig = comm.alloc_window(4, "counter")
                for _ in range(50):
                    comm.notify(sig, 0, 0, 1)                 # flock excludes the other threads' communicators
                t = torch.full((4,), float(rank))
                comm.allreduce(t)
                if rank == 0:
                    totals["count"] = comm.wait(sig, 0, 50 * world, "ge")
                    prefix.append(comm.prefix)
                totals[rank] = t.tolist()
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert totals == {"count": 150, 0: [3.0] * 4, 1: [3.0] * 4, 2: [3.0] * 4}
    assert list_segments(prefix[0]) == []   # no launcher: the communicators unlinked their own segments
