"""The host-side collectives the flagship needs between steps, on the job's communicator: a sum all-reduce of a
few integers (is any rank busy, requests finished, tokens out), a barrier, and an all-gather of a Python object
(each rank's report). In a plain process (no `pypto-launch`) the group is this process alone."""
from __future__ import annotations

import pickle

import torch

from pypto_rt.collective import process


class HostGroup:
    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.world_size = comm.world_size if comm is not None else 1

    @classmethod
    def of_this_job(cls) -> "HostGroup":
        """The launched job's communicator (the one MoE's windows live on), or none outside a launched job."""
        return cls(process.communicator("examples/serve") if process.launched() else None)

    def allreduce_sum(self, values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        if self.comm is not None:
            self.comm.allreduce(t, "sum", label="serve: step agreement")
        return t.tolist()

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.barrier(label="serve: start")

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (an all-gather of its pickle: the ranks are one job's processes)."""
        if self.comm is None:
            return [obj]
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = torch.zeros(self.world_size, 1, dtype=torch.int64)
        self.comm.allgather(sizes, torch.tensor([data.numel()]), label="serve: report sizes")
        padded = torch.zeros(int(sizes.max()), dtype=torch.uint8)
        padded[:data.numel()] = data
        out = torch.zeros(self.world_size, padded.numel(), dtype=torch.uint8)
        self.comm.allgather(out, padded, label="serve: reports")
        return [pickle.loads(out[r, :int(sizes[r, 0])].numpy().tobytes()) for r in range(self.world_size)]

    def close(self) -> None:
        if self.comm is not None:
            process.close()
