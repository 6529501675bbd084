"""The job's rendezvous store: node 0's launcher hosts a torch TCPStore that every rank joins as a client.

Hosting it here (port 0 unless given) means the port the ranks get is the one the store actually bound: no
free-port probing, no race with another job. torch is imported only by the node that hosts the store.
"""
from __future__ import annotations


class StoreError(Exception):
    """The store could not listen; the message says where and what to do."""


def host_store(addr: str, port: int | None):
    """A listening TCPStore on `addr:port` (a free port when `port` is None or 0); returns (store, bound port).

    The store lives as long as the returned object; it does not wait for workers, so a job that never starts
    its ranks does not hang here.
    """
    from torch.distributed import TCPStore
    try:
        store = TCPStore(addr, port or 0, is_master=True, wait_for_workers=False)
    except (RuntimeError, OSError, ValueError) as e:  # DistNetworkError subclasses RuntimeError
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = f"{addr}:{port}" if port else f"{addr} (any free port)"
        raise StoreError(f"cannot host the rendezvous store on {where}: {detail}; "
                         "pick another --master-port (or omit it), or check --master-addr") from None
    return store, store.port
