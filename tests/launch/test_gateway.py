"""Across hosts, node 0's store is reached only through its gateway, which admits holders of the job's secret
(mutual HMAC challenge); other nodes' ranks use their launcher's loopback relay. Simulated on loopback."""
from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from pypto_rt.launch.config import LaunchConfig
from pypto_rt.launch.gateway import Listener, Refused, connect, handshake
from pypto_rt.launch.job_store import StoreError, open_job_store
from tests.collective.test_store_rendezvous import _listening


def _cfg(node_rank: int, secret: str, port: int = 0) -> LaunchConfig:
    return LaunchConfig(target="prog.py", nnodes=2, node_rank=node_rank, master_addr="127.0.0.1",
                        master_port=port, comm="gloo", secret=secret)


@pytest.fixture
def node0():
    job = open_job_store(_cfg(0, "s3cr3t"))
    yield job
    job.close()


def _gate_port(job) -> int:
    return next(h.port for h in job.held if isinstance(h, Listener))


@pytest.mark.timeout(60)
def test_the_store_listens_on_loopback_and_the_gateway_on_the_address_given(node0):
    assert _listening(node0.port) == ["0100007F"] and _listening(_gate_port(node0)) == ["0100007F"]


@pytest.mark.timeout(60)
def test_another_node_reaches_the_store_through_its_relay(node0):
    node0.store.set("from-node-0", "hi")
    node1 = open_job_store(_cfg(1, "s3cr3t", _gate_port(node0)))
    try:
        assert node1.store.get("from-node-0") == b"hi"
        rank = dist.TCPStore("127.0.0.1", node1.port, is_master=False, timeout=timedelta(seconds=10))
        assert dist.PrefixStore("job-s3cr3t/", rank).get("from-node-0") == b"hi"   # what a rank of node 1 does
    finally:
        node1.close()


@pytest.mark.timeout(60)
def test_a_node_with_another_secret_is_refused_saying_so(node0):
    with pytest.raises(StoreError, match="refused node 1: its PYPTO_JOB_SECRET differs"):
        open_job_store(_cfg(1, "guess", _gate_port(node0)))


@pytest.mark.timeout(60)
def test_a_client_without_the_secret_gets_nothing_from_the_gateway(node0):
    node0.store.set("k", "v")
    with socket.create_connection(("127.0.0.1", _gate_port(node0)), timeout=10) as s:
        assert len(s.recv(64)) == 32   # the challenge
        s.sendall(b"\0" * 64)          # a wrong answer (or a TCPStore client's own greeting)
        assert s.recv(64) == b""       # closed: no byte of the store
    with pytest.raises(Refused):       # and a client cannot be fooled by a gateway without the secret
        with socket.create_server(("127.0.0.1", 0)) as fake:
            with socket.create_connection(fake.getsockname(), timeout=10) as c:
                peer, _ = fake.accept()
                peer.sendall(b"\1" * 32)
                peer.sendall(b"\2" * 32)
                handshake(c, "s3cr3t")
    connect(("127.0.0.1", _gate_port(node0)), "s3cr3t").close()
