"""Every rank steps until every rank is done (launched form, 2 ranks): the toy model's forward starts with an
allreduce of its token count, as MoE's collective dispatch does, so ranks whose step counts differed would hang.
Rank 0 serves three requests, rank 1 none: rank 1 steps with empty batches (B = T = 0) meanwhile. Each rank
prints `rank r: PASS steps=<n> empty=<m>` (tokens checked against the plain greedy loop) or fails."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from pypto_rt.collective import process  # noqa: E402
from pypto_rt.serving import Engine, EngineConfig, RankGroup  # noqa: E402
from tests.serving.toy_model import ToyModel  # noqa: E402


class CollectiveToy(ToyModel):
    def __init__(self, comm):
        super().__init__(seed=4)
        self.comm = comm
        self.record = False
        self.calls = 0

    def forward(self, batch):
        self.comm.allreduce(torch.tensor([batch.num_tokens], dtype=torch.int64), label="moe_dispatch_standin")
        self.calls += 1
        return super().forward(batch)


def main():
    comm = process.communicator("the serving EP test")
    rank = comm.rank
    model = CollectiveToy(comm)
    engine = Engine(model, EngineConfig(num_blocks=32, max_batch=4, max_num_batched_tokens=8, max_model_len=32))
    prompts = [([1, 2, 3], 5), ([4, 5, 6, 7, 8, 9, 10, 11, 12], 3), ([2, 2], 7)] if rank == 0 else []
    reqs = [engine.add_request(p, n) for p, n in prompts]

    engine.run(RankGroup(comm).done_everywhere)
    for req in reqs:
        assert req.output_ids == model.greedy_reference(req.prompt_ids, req.max_new_tokens), req.request_id
    m = engine.metrics
    print(f"rank {rank}: PASS steps={m.steps} empty={m.empty_steps} calls={model.calls}", flush=True)


main()
