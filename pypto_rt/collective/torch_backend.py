"""The torch.distributed communicator: gloo on CPU, nccl on CUDA, hccl on Ascend (torch_npu registers it).

Collectives map to dist ops on a process group whose timeout is PYPTO_TIMEOUT_S (uneven all_to_all_v goes
through all_to_all_single with split sizes: gloo rejects uneven all_to_all lists). There are no shared windows,
so signals and one-sided ops raise NotSupportedError pointing at the shm backend. Backend errors become CommErrors
naming the rank and op; timeouts carry a `.wait` record like the shm backend's. With nccl / hccl each rank takes
the accelerator LOCAL_RANK (else its rank) modulo the device count; tensors given to collectives must be on it.
"""
from __future__ import annotations

import atexit
import datetime
import time

import torch
import torch.distributed as dist

from pypto_rt import config

from . import comm_settings, store_rendezvous
from .base import (BackendUnavailableError, CommError, Communicator, PeerAbortedError, check_all_to_all,
                   check_all_to_all_v, check_allgather, check_reduce_scatter, check_src, reduce_op, signature)
from .check import CollectiveCheck
from .waits import describe, timeout_error, wait_record

TORCH_BACKENDS = ("gloo", "nccl", "hccl")
_DEVICE_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_INSTEAD = "use backend 'gloo' (CPU, any host) or 'shm' (ranks on one host)"
# torch 2.13 renamed these (the old names warn); older torch has only the old ones
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def missing_library(backend: str) -> str | None:
    """One sentence naming what this machine lacks for `backend`, or None when it can run it."""
    if backend == "gloo":
        return None if dist.is_gloo_available() else f"this torch {torch.__version__} was built without gloo"
    if backend == "nccl":
        if not dist.is_nccl_available():
            return f"backend 'nccl' needs a CUDA build of torch with NCCL, and this torch {torch.__version__} has none"
        if not torch.cuda.is_available():
            return "backend 'nccl' needs a CUDA GPU, and none is visible"
        return None
    if backend == "hccl":
        try:
            import torch_npu  # noqa: F401  (registers the "hccl" backend and torch.npu)
        except ImportError:
            return "backend 'hccl' needs torch_npu (Ascend's torch plugin, with CANN), which is not installed"
        if not torch.npu.is_available():
            return "backend 'hccl' needs an Ascend NPU, and none is visible"
        return None
    return f"unknown torch.distributed backend {backend!r}"


def _select_device(backend: str, rank: int) -> list[int] | None:
    """nccl / hccl: make this rank's accelerator (LOCAL_RANK, else rank, modulo the count) the current one;
    tensors passed to collectives must live on it. Returns the device ids for barriers (None for gloo)."""
    if backend not in ("nccl", "hccl"):
        return None
    local = config.get_int(comm_settings.LOCAL_RANK)
    module = torch.cuda if backend == "nccl" else torch.npu
    index = (rank if local is None else local) % module.device_count()
    module.set_device(index)
    return [index]


def resolve(backend: str, device=None) -> str:
    """'torch' means the device's default backend (gloo on CPU)."""
    if backend != "torch":
        return backend
    kind = torch.device(device).type if device is not None else "cpu"
    return _DEVICE_BACKEND.get(kind, "gloo")


class TorchCommunicator(Communicator):
    """A process group of `backend` over the job's store (see store_rendezvous.open_store). If this process already
    has a default group of the same world, a new group is made on it; otherwise this communicator creates (and
    at close destroys) the default group."""

    def __init__(self, backend: str = "gloo", rank: int | None = None, world_size: int | None = None, *,
                 store=None, timeout_s: float | None = None, start_timeout_s: float | None = None,
                 host_store: bool = False):
        backend = resolve(backend)
        missing = missing_library(backend)
        if missing:
            raise BackendUnavailableError(f"{missing}: {_INSTEAD}")
        rank = comm_settings.launched_int(comm_settings.RANK, rank, "rank")
        world_size = comm_settings.launched_int(comm_settings.WORLD_SIZE, world_size, "world_size")
        super().__init__(rank, world_size)
        self.backend = backend
        self.timeout_s = comm_settings.timeout_s() if timeout_s is None else float(timeout_s)
        start_s = comm_settings.start_timeout_s() if start_timeout_s is None else float(start_timeout_s)
        self._device_ids = _select_device(backend, rank)
        base = store_rendezvous.open_store(rank, world_size, store, start_s, host_store)
        self.instance, self.store = store_rendezvous.instance_store(base, rank)
        store_rendezvous.start(self.store, rank, world_size, start_s)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self._owns_default = not dist.is_initialized()
        if self._owns_default:
            dist.init_process_group(backend, store=dist.PrefixStore("pg/", self.store), rank=rank,
                                    world_size=world_size, timeout=timeout)
            self.group = dist.group.WORLD
        else:
            if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
                raise CommError(f"rank {rank}: this process already has a default process group as rank "
                                f"{dist.get_rank()} of {dist.get_world_size()}, not rank {rank} of {world_size}")
            self.group = dist.new_group(backend=backend, timeout=timeout)
        self._check = CollectiveCheck(self.store, rank, world_size, self.timeout_s) if comm_settings.comm_check() else None
        self._closed = False
        self._at_exit = self._abort_at_exit()   # (see _destroy)

    # ------------------------------------------------------------------------------------------ plumbing
    def _run(self, op: str, label, sig: str, fn) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank}: {op} on a closed communicator")
        if self._check is not None:
            self._check(op, sig, label)
        start = time.monotonic()
        try:
            fn()
        except RuntimeError as e:
            raise self._translate(op, label, e, time.monotonic() - start) from e

    def _translate(self, op: str, label, err: RuntimeError, waited: float) -> CommError:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        low = str(err).lower()
        others = [r for r in range(self.world_size) if r != self.rank]   # a collective waits on every rank
        w = wait_record(self.rank, op, label, peers=others, waited_s=waited)
        if "timed out" in low or "timeout" in low:
            return timeout_error(w, hint=f"a peer never joined this {self.backend} {op} within PYPTO_TIMEOUT_S="
                                         f"{self.timeout_s:g} s (it is stuck elsewhere, or skipped it); {text}")
        if any(s in low for s in ("connection closed", "connection reset", "broken pipe", "peer")):
            return PeerAbortedError(f"a peer left the job, so this {self.backend} op ends: {describe(w)}: {text}",
                                    hint="that rank's own error is the root cause", wait=w)
        return CommError(f"rank {self.rank}: {op} failed on the {self.backend} backend: {text}")

    @staticmethod
    def _inplace(tensor: torch.Tensor, fn) -> torch.Tensor:
        """Run fn on a contiguous tensor (dist ops need one), copying back when `tensor` is not."""
        if tensor.is_contiguous():
            fn(tensor)
        else:
            tmp = tensor.contiguous()
            fn(tmp)
            tensor.copy_(tmp)
        return tensor

    # ------------------------------------------------------------------------------------------ collectives
    def _barrier(self) -> None:
        if self._device_ids is None:
            dist.barrier(group=self.group)
        else:
            dist.barrier(group=self.group, device_ids=self._device_ids)

    def barrier(self, *, label: str | None = None) -> None:
        self._run("barrier", label, "barrier()", self._barrier)

    def allreduce(self, tensor: torch.Tensor, op="sum", *, label: str | None = None) -> torch.Tensor:
        op = reduce_op(op)
        self._run("allreduce", label, signature("allreduce", tensor, op=op), lambda: self._inplace(
            tensor, lambda t: dist.all_reduce(t, _REDUCE[op], group=self.group)))
        return tensor

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, *, label: str | None = None) -> torch.Tensor:
        check_allgather(self, out, inp)
        self._run("allgather", label, signature("allgather", inp), lambda: self._inplace(
            out, lambda o: _all_gather_single(o.view(-1), inp.reshape(-1), group=self.group)))
        return out

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op="sum", *,
                       label: str | None = None) -> torch.Tensor:
        op = reduce_op(op)
        check_reduce_scatter(self, out, inp)
        self._run("reduce_scatter", label, signature("reduce_scatter", inp, op=op), lambda: self._inplace(
            out, lambda o: _reduce_scatter_single(o.view(-1), inp.reshape(-1), _REDUCE[op], group=self.group)))
        return out

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, *, label: str | None = None) -> torch.Tensor:
        check_all_to_all(self, out, inp)
        self._run("all_to_all", label, signature("all_to_all", inp), lambda: self._inplace(
            out, lambda o: dist.all_to_all_single(o, inp.contiguous(), group=self.group)))
        return out

    def all_to_all_v(self, out: torch.Tensor, inp: torch.Tensor, send_counts, recv_counts, *,
                     label: str | None = None) -> torch.Tensor:
        send, recv = check_all_to_all_v(self, out, inp, send_counts, recv_counts)
        live_in, live_out = inp[:sum(send)].contiguous(), out[:sum(recv)]   # only the live rows travel
        self._run("all_to_all_v", label, signature("all_to_all_v", inp, shape=("*", *inp.shape[1:])),
                  lambda: self._inplace(live_out, lambda o: dist.all_to_all_single(
                      o, live_in, output_split_sizes=recv, input_split_sizes=send, group=self.group)))
        return out

    def broadcast(self, tensor: torch.Tensor, src: int, *, label: str | None = None) -> torch.Tensor:
        src = check_src(self, src, "broadcast")
        self._run("broadcast", label, signature("broadcast", tensor, src=src), lambda: self._inplace(
            tensor, lambda t: dist.broadcast(t, src, group=self.group)))
        return tensor

    # ------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Exit barrier (the group's timeout), then destroy the group this communicator made."""
        if self._closed:
            return
        try:
            self._run("close", None, "close()", self._barrier)
        finally:
            self._destroy()

    def abort(self, why: str = "") -> None:
        """Destroy the group without a barrier: peers blocked on this rank see its sockets close."""
        if not self._closed:
            self._destroy()

    def _destroy(self) -> None:
        """Destroy the group and drop this communicator's reference to it. gloo's shutdown is a no-op: its worker
        threads end only when the last reference goes, and a worker that ends during interpreter teardown (still
        releasing a collective's tensors) aborts the process ("terminate called without an active exception")."""
        self._closed = True
        atexit.unregister(self._at_exit)
        if dist.is_initialized():
            dist.destroy_process_group(None if self._owns_default else self.group)
        self.group = None   # the group's threads are joined here, while the interpreter is whole
