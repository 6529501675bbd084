"""pypto_rt.collective: communicators that move bytes between the ranks of a job.

    comm = create_communicator("shm")            # rank/world from RANK/WORLD_SIZE, store from MASTER_ADDR/PORT
    win = comm.alloc_window(4096)                # collective: zeroed, symmetric
    comm.notify(win, peer=1, byte_offset=0, value=1, op="atomic_add")
    comm.wait(win, 0, expected=1, cmp="ge", label="recv")
    comm.allreduce(t, "sum"); comm.close()

Backends: `shm` (ranks on one host: POSIX shared-memory windows, signals, one-sided ops and fast staged
collectives) and torch.distributed's `gloo` / `nccl` / `hccl` (collectives only; `torch` picks the device's
default). Every blocking wait has a deadline (PYPTO_TIMEOUT_S, after a start rendezvous bounded by
PYPTO_START_TIMEOUT_S) and fails with a CommTimeoutError whose `.wait` record `waits.merge_reports` joins across
ranks. Sits beside the aicpu engine: imports only pypto_rt.errors and pypto_rt.config from pypto_rt.
"""
from __future__ import annotations

from .base import (BackendUnavailableError, CollectiveMismatchError, CommError, CommTimeoutError, Communicator,
                   PeerAbortedError, Window)
from .segments import list_segments, remove_segments
from .waits import WAIT_KEYS, merge_reports

__all__ = ["BACKENDS", "BackendUnavailableError", "CollectiveMismatchError", "CommError", "CommTimeoutError",
           "Communicator", "PeerAbortedError", "WAIT_KEYS", "Window", "available_backends", "create_communicator",
           "create_node_communicator",
           "list_segments", "merge_reports", "remove_segments"]

BACKENDS = ("shm", "gloo", "nccl", "hccl", "torch")


def available_backends() -> list[str]:
    """Backends this machine can run now (`shm` needs /dev/shm; the torch ones their library and device)."""
    import os

    from .torch_backend import TORCH_BACKENDS, missing_library
    found = ["shm"] if os.path.isdir("/dev/shm") else []
    return found + [b for b in TORCH_BACKENDS if missing_library(b) is None]


def create_communicator(backend: str, rank: int | None = None, world_size: int | None = None, **options
                        ) -> Communicator:
    """A communicator of `backend` for this rank; every rank of the job calls it (it is a rendezvous).

    rank / world_size default to RANK / WORLD_SIZE. Options: `store` (a torch.distributed Store shared by the
    ranks; default a TCPStore client of MASTER_ADDR:MASTER_PORT, with `host_store=True` rank 0 serves it),
    `timeout_s`, `start_timeout_s`; shm only: `prefix` (default PYPTO_SHM_PREFIX), `owner_unlinks`.
    """
    if backend == "shm":
        from .shm_communicator import ShmCommunicator
        return ShmCommunicator(rank, world_size, **options)
    if backend in ("gloo", "nccl", "hccl", "torch"):
        from .torch_backend import TorchCommunicator
        return TorchCommunicator(backend, rank, world_size, **options)
    raise BackendUnavailableError(f"unknown communicator backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def create_node_communicator(**options) -> Communicator:
    """A `shm` communicator of the ranks on this rank's node only (every rank of the node calls it): windows and
    fast collectives within a node of a job whose ranks span nodes (`pypto-launch --backend ray`), beside a
    job-wide `gloo`/`nccl`/`hccl` one for collectives across nodes. Its rank is the rank's index among its node's
    ranks (= LOCAL_RANK); its store is the job's, scoped to the node. On one node it spans the whole job."""
    from . import comm_settings, nodes, store_rendezvous
    rank = comm_settings.launched_int(comm_settings.RANK, options.pop("rank", None), "rank")
    members = nodes.node_ranks(rank)
    if "store" not in options:
        import torch.distributed as dist
        world = comm_settings.launched_int(comm_settings.WORLD_SIZE, None, "world_size")
        base = store_rendezvous.open_store(rank, world, None, comm_settings.start_timeout_s())
        options["store"] = dist.PrefixStore(f"pypto/node-of-rank-{members[0]}/", base)
    return create_communicator("shm", members.index(rank), len(members), **options)
