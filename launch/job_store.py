"""The job's rendezvous store: node 0's launcher hosts a torch TCPStore that every rank (and every other node's
launcher) joins as a client, all under the job's secret (see pypto_rt.collective.store_rendezvous).

Hosting it here (port 0 unless given) means the port the ranks get is the one the store actually bound: no
free-port probing, no race with another job. The store listens on loopback only, and ranks always reach it on
loopback: across hosts, through node 0's gateway on --master-addr:--master-port, which admits only holders of
the job's secret, and their own node's relay to it (see `gateway`). torch is imported only by the launchers.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from pypto_rt.launch.config import LaunchConfig

LOOPBACK = "127.0.0.1"
JOIN_S = 60.0  # how long another node's launcher keeps trying to reach node 0 (which may still be starting)


@dataclass
class JobStore:
    """This node's way to the job's store: `store` is the job's scope of it (every key goes through it), `port`
    the loopback port this node's ranks use; `held` (the server, gateway or relay) lives until `close`."""
    store: object
    port: int
    held: list = field(default_factory=list)

    def close(self) -> None:
        for thing in self.held:
            if hasattr(thing, "close"):
                thing.close()
        self.held.clear()
        self.store = None


def open_job_store(cfg: LaunchConfig) -> JobStore:
    """Node 0 hosts the store (and, across hosts, the gateway to it); other nodes check the gateway admits them
    and start their relay. StoreError, saying what to do, when that fails."""
    if cfg.node_rank > 0:
        return _join_through_gateway(cfg)
    server, store, port = host_store(LOOPBACK, cfg.master_port if cfg.nnodes == 1 else 0, cfg.secret)
    job = JobStore(store, port, [server])
    if cfg.nnodes > 1:
        from pypto_rt.launch.gateway import gateway
        try:
            gate = gateway(cfg.master_addr, cfg.master_port or 0, port, cfg.secret)
        except OSError as e:
            where = f"{cfg.master_addr}:{cfg.master_port}" if cfg.master_port else cfg.master_addr
            raise StoreError(f"cannot listen on {where} for the other nodes: {e.strerror or e}; pick another "
                             "--master-port (or omit it), or check --master-addr") from None
        job.held.append(gate)
        print(f"pypto-launch: rendezvous store at {cfg.master_addr}:{gate.port}; start the other nodes with "
              f"--master-addr {cfg.master_addr} --master-port {gate.port} and this PYPTO_JOB_SECRET", file=sys.stderr)
    return job


def _join_through_gateway(cfg: LaunchConfig) -> JobStore:
    from pypto_rt.launch.gateway import Refused, connect, relay
    remote, deadline = (cfg.master_addr, cfg.master_port), time.monotonic() + JOIN_S
    while True:
        try:
            connect(remote, cfg.secret).close()
            break
        except Refused:
            raise StoreError(f"node 0's gateway at {cfg.master_addr}:{cfg.master_port} refused node "
                             f"{cfg.node_rank}: its PYPTO_JOB_SECRET differs; set the same PYPTO_JOB_SECRET on "
                             "every node") from None
        except OSError as e:
            if time.monotonic() >= deadline:
                raise StoreError(f"node {cfg.node_rank} cannot reach node 0 at {cfg.master_addr}:"
                                 f"{cfg.master_port} within {JOIN_S:g} s: {e.strerror or e}; start node 0 and "
                                 "check --master-addr/--master-port") from None
            time.sleep(0.2)
    local = relay(remote, cfg.secret)
    try:
        return JobStore(join_store(LOOPBACK, local.port, cfg.secret, cfg.node_rank), local.port, [local])
    except StoreError:
        local.close()
        raise


class StoreError(Exception):
    """The store could not listen, or be joined; the message says where and what to do."""


def host_store(addr: str, port: int | None, secret: str):
    """A TCPStore listening on `addr:port` only (a free port when `port` is None or 0); returns (server, the
    job's scope of it, bound port). The scope must be used for every key; the server must live as long as the job.
    """
    from pypto_rt.collective.store_rendezvous import serve
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

    from pypto_rt.collective.store_rendezvous import join
    from pypto_rt.errors import PyptoError
    try:
        client = TCPStore(addr, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
        return join(client, secret, f"{addr}:{port}", f"node {node}")
    except PyptoError as e:
        raise StoreError(f"{e.message}; set the same PYPTO_JOB_SECRET on every node") from None
    except (RuntimeError, OSError, ValueError) as e:
        raise StoreError(f"node {node} cannot reach node 0's store at {addr}:{port}: {e}; start node 0 first and "
                         "check --master-addr/--master-port") from None
