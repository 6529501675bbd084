"""The job's rendezvous store: node 0's launcher hosts a torch TCPStore that every rank (and every other node's
launcher) joins as a client, all under the job's secret (see pypto_rt.collective.rendezvous).

Hosting it here (port 0 unless given) means the port the ranks get is the one the store actually bound: no
free-port probing, no race with another job. It listens on loopback for a one-host job, else on --master-addr
only. torch is imported only by the launchers, never by a rank that does not use it.
"""
from __future__ import annotations

LOOPBACK = "127.0.0.1"


class StoreError(Exception):
    """The store could not listen, or be joined; the message says where and what to do."""


def host_store(addr: str, port: int | None, secret: str):
    """A TCPStore listening on `addr:port` only (a free port when `port` is None or 0); returns (server, the
    job's scope of it, bound port). The scope must be used for every key; the server must live as long as the job.
    """
    from pypto_rt.collective.rendezvous import serve
    try:
        server, scope = serve(addr, port or 0, secret)
    except (RuntimeError, OSError, ValueError) as e:  # DistNetworkError subclasses RuntimeError
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = f"{addr}:{port}" if port else f"{addr} (any free port)"
        raise StoreError(f"cannot host the rendezvous store on {where}: {detail}; "
                         "pick another --master-port (or omit it), or check --master-addr") from None
    return server, scope, server.port


def join_store(addr: str, port: int, secret: str, node: int):
    """Node `node`'s client of node 0's store, scoped to the job; StoreError if unreachable or the secret differs."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from pypto_rt.collective.rendezvous import join
    from pypto_rt.errors import PyptoError
    try:
        client = TCPStore(addr, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
        return join(client, secret, f"{addr}:{port}", f"node {node}")
    except PyptoError as e:
        raise StoreError(f"{e.message}; set the same PYPTO_JOB_SECRET on every node") from None
    except (RuntimeError, OSError, ValueError) as e:
        raise StoreError(f"node {node} cannot reach node 0's store at {addr}:{port}: {e}; start node 0 first and "
                         "check --master-addr/--master-port") from None
