"""Run a function on N rank processes (fork) that share a parent-hosted TCPStore, as pypto-launch would.

Fork, not spawn: a forked rank starts in ~0.05 s, a spawned one re-imports torch (~2 s on 2 cores).

The children are forked *before* the parent starts the store's server thread (fork with live threads is
fragile), then receive its port (the OS picked it: no free-port race). Each rank returns a small picklable value
or its error (type, text, `.wait`). The parent waits up to one deadline, kills ranks still alive, lists the
job's /dev/shm/<prefix>+* segments left behind, then removes them as the launcher does. Timeouts are layered:
PYPTO_TIMEOUT_S in the ranks (default 5 s here) < the harness deadline < the test's pytest timeout.
"""
from __future__ import annotations

import datetime
import gc
import multiprocessing as mp
import os
import secrets
import time
import traceback
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pypto_rt.collective import create_communicator, list_segments, remove_segments


@dataclass
class Rank:
    """What a rank function gets: its identity, the job's store and shm prefix, and a communicator factory."""
    rank: int
    world_size: int
    store: object
    prefix: str
    owner_unlinks: bool

    def comm(self, backend: str = "shm", **options):
        if backend == "shm":
            options.setdefault("prefix", self.prefix)
            options.setdefault("owner_unlinks", self.owner_unlinks)
        return create_communicator(backend, self.rank, self.world_size, store=self.store, **options)


@dataclass
class Outcome:
    results: dict = field(default_factory=dict)    # rank -> returned value
    errors: dict = field(default_factory=dict)     # rank -> {"type", "text", "wait", "traceback"} or {"died": code}
    leftovers: list = field(default_factory=list)  # segments still under /dev/shm before the cleanup
    elapsed_s: float = 0.0

    def ok(self) -> dict:
        assert not self.errors, "\n\n".join(f"rank {r}: {e.get('traceback') or e}" for r, e in
                                            sorted(self.errors.items()))
        return self.results


def new_prefix() -> str:
    return f"pypto-test-{os.getpid()}-{secrets.token_hex(4)}"


def _child(fn, rank, world_size, conn, queue, env, prefix, owner_unlinks):
    gc.freeze()   # pytest's garbage is never collected here (a C++ object's destructor would join a missing thread)
    code = 0
    try:
        os.environ.update(env)
        torch.set_num_threads(1)
        port = conn.recv()
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=30))
        value = fn(Rank(rank, world_size, store, prefix, owner_unlinks))
        queue.put((rank, "ok", value))
    except BaseException as e:   # noqa: BLE001 - everything goes back to the parent
        queue.put((rank, "err", {"type": type(e).__name__, "text": str(e), "wait": getattr(e, "wait", None),
                                 "traceback": traceback.format_exc()}))
        code = 1
    finally:
        os._exit(code)   # never run the forked pytest's own exit handlers


def run_ranks(fn, world_size: int, *, env: dict | None = None, deadline_s: float = 30.0,
              owner_unlinks: bool = True, prefix: str | None = None) -> Outcome:
    env = {"PYPTO_TIMEOUT_S": "5", **(env or {})}
    prefix = prefix or new_prefix()
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, pipes[r][0], queue, env, prefix, owner_unlinks),
                         daemon=True) for r in range(world_size)]
    start = time.monotonic()
    with warnings.catch_warnings():
        # Python 3.12+ warns on fork in any multi-threaded process; torch keeps an idle thread from import on,
        # which the forked ranks never use
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        for p in procs:
            p.start()
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
    for _, send in pipes:
        send.send(store.port)
    out = Outcome()
    end = start + deadline_s
    while len(out.results) + len(out.errors) < world_size and time.monotonic() < end:
        if not queue.empty():
            rank, kind, value = queue.get()
            (out.results if kind == "ok" else out.errors)[rank] = value
            continue
        for r, p in enumerate(procs):
            if p.exitcode is not None and r not in out.results and r not in out.errors and queue.empty():
                out.errors[r] = {"died": p.exitcode}
        time.sleep(0.005)
    for r, p in enumerate(procs):
        p.join(timeout=max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            out.errors.setdefault(r, {"hung": f"killed after the harness deadline of {deadline_s} s"})
    out.elapsed_s = time.monotonic() - start
    del store
    out.leftovers = list_segments(prefix)
    remove_segments(prefix)
    assert list_segments(prefix) == []
    return out
