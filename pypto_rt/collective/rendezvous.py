"""How a communicator meets its peers: a torch.distributed store (TCPStore across processes, any Store passed in).

Creating a communicator is itself a rendezvous bounded by PYPTO_START_TIMEOUT_S: every rank announces itself and
waits until all have, so the PYPTO_TIMEOUT_S clocks of later waits start only once the whole job is up. The k-th
communicator a rank creates uses the key space `pypto/comm/<k>/` (ranks create communicators in the same order).
"""
from __future__ import annotations

import datetime

import torch.distributed as dist

from pypto_rt.errors import PyptoError

from . import knobs
from .waits import backoff_wait, timeout_error, wait_record


def open_store(rank: int, world_size: int, store=None, start_timeout_s: float = 120.0, host_store: bool = False):
    """`store` if given; else a TCPStore client of MASTER_ADDR:MASTER_PORT (the launcher runs the server; with
    `host_store=True` rank 0 runs it, torch's env:// convention); a private HashStore for a world of one."""
    if store is not None:
        return store
    addr, port = knobs.MASTER_ADDR.get(), knobs.MASTER_PORT.get()
    if not addr or not port:
        if world_size == 1:
            return dist.HashStore()
        raise PyptoError(f"rank {rank}: a communicator of {world_size} ranks needs a store: MASTER_ADDR/MASTER_PORT "
                         f"are not set", hint="start the ranks with pypto-launch (or torchrun), or pass store=")
    try:
        return dist.TCPStore(addr, int(port), world_size, is_master=host_store and rank == 0,
                             timeout=datetime.timedelta(seconds=start_timeout_s), wait_for_workers=False)
    except (RuntimeError, ValueError) as e:
        raise PyptoError(f"rank {rank}: cannot reach the job's store at {addr}:{port} within "
                         f"{start_timeout_s:g} s: {e}", hint="is the launcher (or rank 0's store) up? "
                         "PYPTO_START_TIMEOUT_S bounds this wait") from None


def instance_store(store, rank: int):
    """(k, store scoped to this rank's k-th communicator); every rank's k-th communicator shares the scope."""
    k = store.add(f"pypto/comm/count/{rank}", 1)
    return k, dist.PrefixStore(f"pypto/comm/{k}/", store)


def missing_ranks(store, key: str, world_size: int) -> list[int]:
    return [r for r in range(world_size) if not store.check([f"{key}/{r}"])]


def wait_for_ranks(store, key: str, rank: int, world_size: int, timeout_s: float, op: str,
                   label: str | None = None, watch=None, hint: str | None = None) -> None:
    """Every rank sets `key/<rank>`; return once all have, else a CommTimeoutError naming the missing ranks."""
    keys = [f"{key}/{r}" for r in range(world_size)]
    # a poll is a store round trip (~25 µs): few spins, sleeps up to 10 ms
    waited = backoff_wait(lambda: store.check(keys), timeout_s, watch, spin=4, yields=20, max_sleep=0.01)
    if waited is None:
        missing = missing_ranks(store, key, world_size)
        raise timeout_error(wait_record(rank, op, label, seen=world_size - len(missing), expected=world_size,
                                        cmp="eq", peers=missing, waited_s=timeout_s), hint)


def start(store, rank: int, world_size: int, timeout_s: float) -> None:
    """The start rendezvous: announce this rank, wait for all (PYPTO_START_TIMEOUT_S)."""
    store.set(f"up/{rank}", "1")
    wait_for_ranks(store, "up", rank, world_size, timeout_s, "start", hint=(
        "the missing ranks never created their communicator: they failed or are still importing (8 ranks "
        "importing torch on 2 cores take ~10 s); raise PYPTO_START_TIMEOUT_S if the job is just slow to start"))
