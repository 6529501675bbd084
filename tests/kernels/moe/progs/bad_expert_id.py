"""Launched MoE dispatch where the last rank routes a token to an expert id past num_experts: that rank must fail
with an MoEArgumentError naming itself and the argument before any communication, and the job must end promptly
(its peers, already in the dispatch's first collective or wait, see it leave instead of waiting for the timeout).

    pypto-launch --nproc N [--comm gloo] bad_expert_id.py
"""
import torch

import pypto.language.distributed as pld
from pypto_rt.kernels.moe import MoEBuffer, MoEConfig

HIDDEN, PER_RANK, TOP_K, T = 16, 2, 2, 3


def main():
    me, world = pld.rank(), pld.world_size()
    experts = PER_RANK * world
    buf = MoEBuffer(MoEConfig(hidden=HIDDEN, num_experts=experts, top_k=TOP_K, max_tokens_per_rank=T,
                              dtype=torch.float32))
    idx = torch.tensor([[0, 1]] * T, dtype=torch.int32)
    if me == world - 1:
        idx[T - 1, 1] = experts
    buf.dispatch(torch.ones(T, HIDDEN), idx, torch.full((T, TOP_K), 0.5))
    print(f"rank {me}/{world}: dispatch returned")


if __name__ == "__main__":
    main()
