"""`RankGroup`: the host-side agreement a multi-rank serving loop needs between steps, on the launched job's
communicator (the one MoE's windows live on): a sum all-reduce of a few integers, "is every rank done" for
`Engine.run(done_everywhere=group.done_everywhere)`, a barrier, and an all-gather of a Python object (each
rank's report). Outside a launched job the group is this process alone, and every call is local.

With attention data-parallel and experts expert-parallel, every rank must step until every rank is done (MoE's
dispatch is collective): this is the one host read per step such a loop makes, and it reads no device data.
"""
from __future__ import annotations

import pickle

import torch

from pypto_rt.collective import process


class RankGroup:
    def __init__(self, comm=None):
        """comm: a communicator (`pypto_rt.collective.process.communicator`), or None for this process alone."""
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.world_size = comm.world_size if comm is not None else 1

    @classmethod
    def of_this_job(cls, what: str = "pypto_rt.serving.RankGroup") -> "RankGroup":
        """The launched job's communicator, or this process alone outside a launched job."""
        return cls(process.communicator(what) if process.launched() else None)

    def allreduce_sum(self, values: list[int], label: str = "serving: step agreement") -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        if self.comm is not None:
            self.comm.allreduce(t, "sum", label=label)
        return t.tolist()

    def done_everywhere(self, local_done: bool) -> bool:
        """True when every rank is done: the `done_everywhere` argument of `Engine.run` / `Engine.generate`."""
        return self.allreduce_sum([0 if local_done else 1], label="serving: done everywhere")[0] == 0

    def barrier(self, label: str = "serving: barrier") -> None:
        if self.comm is not None:
            self.comm.barrier(label=label)

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (an all-gather of its pickle: the ranks are one job's processes)."""
        if self.comm is None:
            return [obj]
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = torch.zeros(self.world_size, 1, dtype=torch.int64)
        self.comm.allgather(sizes, torch.tensor([data.numel()]), label="serving: gather sizes")
        padded = torch.zeros(int(sizes.max()), dtype=torch.uint8)
        padded[:data.numel()] = data
        out = torch.zeros(self.world_size, padded.numel(), dtype=torch.uint8)
        self.comm.allgather(out, padded, label="serving: gather")
        return [pickle.loads(out[r, :int(sizes[r, 0])].numpy().tobytes()) for r in range(self.world_size)]
