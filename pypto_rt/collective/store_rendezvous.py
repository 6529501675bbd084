"""How a communicator meets its peers: a torch.distributed store (TCPStore across processes, any Store passed in).

Creating a communicator is itself a rendezvous bounded by PYPTO_START_TIMEOUT_S: every rank announces itself and
waits until all have, so the PYPTO_TIMEOUT_S clocks of later waits start only once the whole job is up. The
launcher marks each rank whose process ended (`pypto-launch/exited/<rank>` = its exit code, in the job's scope):
a rank still missing with such a mark will never come, and the wait fails at once naming it. The k-th
communicator a rank creates uses the key space `pypto/comm/<k>/` (ranks create communicators in the same order).

Who may use a store: torch's TCPStore server listens on every interface whatever host it is given, so `serve`
binds the listening socket itself (loopback for one host, the address given for several) and hands it over.
TCPStore has no authentication: every key of a job lives under `job-<secret>/`, the per-job random secret the
launcher (or the host form) passes its ranks in PYPTO_JOB_SECRET (the environment: argv is public in /proc), and
a client checks at start that the job's marker key is there, so a wrong or missing secret fails at once, saying
so. This keeps jobs apart and refuses a stray client; it is no defence against a client that can connect and means
harm: TCPStore's `list_keys` shows it every key name, the secret among them (see README, Known limits). Across
hosts, pypto-launch keeps the store on loopback behind an authenticating gateway (pypto_rt.launch.gateway).
"""
from __future__ import annotations

import datetime
import socket

import torch.distributed as dist

from pypto_rt.errors import PyptoError
from pypto_rt.knobs import JOB_SECRET

from . import comm_settings
from .base import PeerAbortedError
from .process import launched
from .waits import backoff_wait, timeout_error, wait_record

SECRET_ENV = JOB_SECRET.env
_JOB_KEY = "pypto/job"  # set under the secret's prefix by whoever serves the store
_BACKLOG = 1024
EXITED_KEY = "pypto-launch/exited"  # <key>/<rank> = exit code: set by the launcher when a rank's process ends


def listen(addr: str, port: int) -> socket.socket:
    """A TCP socket listening on `addr:port` only (port 0: a free one)."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def serve(addr: str, port: int, secret: str | None):
    """A TCPStore server reachable at `addr:port` only; returns (server, the job's scope of it: the server itself
    without a secret). The server lives as long as the returned object and does not wait for workers. Raises
    OSError or RuntimeError when it cannot listen."""
    sock = listen(addr, port)
    bound = sock.getsockname()[1]
    server = dist.TCPStore(addr, bound, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach())
    if not secret:
        return server, server
    scope = _scope(server, secret)
    scope.set(_JOB_KEY, "1")
    return server, scope


def join(store, secret: str, where: str, who: str):
    """The job's scope of a store client; PyptoError if the server does not know `secret` (`who` is "rank N" or
    similar, `where` the server's address)."""
    scope = _scope(store, secret)
    if not scope.check([_JOB_KEY]):
        raise PyptoError(f"{who}: the store at {where} is not this job's, or {SECRET_ENV} differs from the one it "
                         f"was started with", hint=f"start every rank (and node) of a job with the same "
                         f"{SECRET_ENV}; pypto-launch sets it for its ranks")
    return scope


def _scope(store, secret: str):
    return dist.PrefixStore(f"job-{secret}/", store)


def open_store(rank: int, world_size: int, store=None, start_timeout_s: float = 120.0, host_store: bool = False):
    """`store` if given; else a TCPStore client of MASTER_ADDR:MASTER_PORT (the launcher runs the server; with
    `host_store=True` rank 0 runs it, torch's env:// convention); a private HashStore for a world of one."""
    if store is not None:
        return store
    addr, port = comm_settings.MASTER_ADDR.get(), comm_settings.MASTER_PORT.get()
    if not addr or not port:
        if world_size == 1:
            return dist.HashStore()
        raise PyptoError(f"rank {rank}: a communicator of {world_size} ranks needs a store: MASTER_ADDR/MASTER_PORT "
                         f"are not set", hint="start the ranks with pypto-launch (or torchrun), or pass store=")
    secret = JOB_SECRET.get()
    if launched() and not secret:
        raise PyptoError(f"rank {rank}: {SECRET_ENV} is not set, so this rank cannot use the job's store",
                         hint=f"pypto-launch gives every rank {SECRET_ENV}; keep it in the rank's environment")
    try:
        if host_store and rank == 0:   # torch's env:// convention: rank 0 serves (here on MASTER_ADDR only)
            return serve(addr, int(port), secret)[1]
        client = dist.TCPStore(addr, int(port), world_size, is_master=False,
                               timeout=datetime.timedelta(seconds=start_timeout_s), wait_for_workers=False)
    except (RuntimeError, ValueError, OSError) as e:
        raise PyptoError(f"rank {rank}: cannot reach the job's store at {addr}:{port} within "
                         f"{start_timeout_s:g} s: {e}", hint="is the launcher (or rank 0's store) up? "
                         "PYPTO_START_TIMEOUT_S bounds this wait") from None
    return join(client, secret, f"{addr}:{port}", f"rank {rank}") if secret else client


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


def _exited_watch(store, key: str, rank: int, world_size: int):
    """A backoff_wait `watch` raising PeerAbortedError when a rank missing from `key` has exited (the launcher's
    mark in the job's scope, which `store` prefixes); None when `store` is not a scope of another store."""
    job = getattr(store, "underlying_store", None)
    if job is None:
        return None

    def watch():
        gone = [r for r in missing_ranks(store, key, world_size) if job.check([f"{EXITED_KEY}/{r}"])]
        if gone:
            codes = ", ".join(f"rank {r} exited (exit code {job.get(f'{EXITED_KEY}/{r}').decode()})" for r in gone)
            w = wait_record(rank, "start", seen=world_size - len(gone), expected=world_size, cmp="eq", peers=gone)
            raise PeerAbortedError(f"rank {rank}: {codes} before creating its communicator, so it can never join "
                                   "this one", hint="every rank must create the same communicators (or none); the "
                                   "exited rank's output says where it stopped", wait=w)
    return watch


def start(store, rank: int, world_size: int, timeout_s: float) -> None:
    """The start rendezvous: announce this rank, wait for all (PYPTO_START_TIMEOUT_S), unless one that has not
    come has already exited. `store` is the communicator's scope (`instance_store`) of the job's store."""
    store.set(f"up/{rank}", "1")
    watch = _exited_watch(store, "up", rank, world_size)
    wait_for_ranks(store, "up", rank, world_size, timeout_s, "start", watch=watch, hint=(
        "the missing ranks never created their communicator: they failed or are still importing (8 ranks "
        "importing torch on 2 cores take ~10 s); raise PYPTO_START_TIMEOUT_S if the job is just slow to start"))
