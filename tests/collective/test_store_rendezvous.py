"""The job's store (store_rendezvous.serve / join / open_store): where it listens and who may use it."""
from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from pypto_rt.collective import store_rendezvous
from pypto_rt.errors import PyptoError


def _listening(port: int) -> list[str]:
    """Local addresses (kernel hex) of the sockets listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            addr, p = fields[1].rsplit(":", 1)
            if int(p, 16) == port and fields[3] == "0A":
                found.append(addr)
    return found


def _client(port: int):
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))


@pytest.mark.timeout(30)
def test_a_served_store_listens_on_the_address_given_only():
    # torch's own server listens on every interface whatever host it is given (as the host form's store did)
    server, scope = store_rendezvous.serve("127.0.0.1", 0, "s3cr3t")
    assert _listening(server.port) == ["0100007F"]
    scope.set("k", "v")
    assert store_rendezvous.join(_client(server.port), "s3cr3t", "here", "rank 1").get("k") == b"v"


@pytest.mark.timeout(30)
def test_a_client_with_another_secret_is_refused_saying_so():
    server, scope = store_rendezvous.serve("127.0.0.1", 0, "s3cr3t")
    scope.set("k", "v")
    with pytest.raises(PyptoError, match="rank 3: the store at 127.0.0.1:.* is not this job's, or PYPTO_JOB_SECRET"):
        store_rendezvous.join(_client(server.port), "guess", f"127.0.0.1:{server.port}", "rank 3")
    assert not _client(server.port).check(["k"])


@pytest.mark.timeout(30)
def test_a_launched_rank_without_the_secret_is_told_so(monkeypatch):
    server, _ = store_rendezvous.serve("127.0.0.1", 0, "s3cr3t")
    for k, v in {"PYPTO_LAUNCHED": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PYPTO_JOB_SECRET", raising=False)
    with pytest.raises(PyptoError, match="rank 1: PYPTO_JOB_SECRET is not set"):
        store_rendezvous.open_store(1, 2, start_timeout_s=5)
    monkeypatch.setenv("PYPTO_JOB_SECRET", "s3cr3t")
    store_rendezvous.open_store(1, 2, start_timeout_s=5).set("joined", "1")


@pytest.mark.timeout(30)
@pytest.mark.xfail(strict=True, reason="TCPStore's list_keys shows any client every key name, the secret prefix "
                   "among them: on one host (loopback) the secret keeps jobs apart, it does not stop a local client "
                   "that means harm (across hosts, pypto-launch's gateway authenticates connections)")
def test_a_client_without_the_secret_cannot_learn_the_jobs_keys():
    server, scope = store_rendezvous.serve("127.0.0.1", 0, "s3cr3t")
    scope.set("k", "v")
    assert not any("s3cr3t" in key for key in _client(server.port).list_keys())
