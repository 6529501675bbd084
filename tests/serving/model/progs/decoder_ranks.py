"""MoEDecoder in a launched job against GoldenDecoder, on every rank (prints PASS / FAIL per check).

    pypto-launch --nproc 2 decoder_ranks.py

Attention is data-parallel: each rank serves its own requests over its own KV pool, stepped by hand; the experts
are expert-parallel, so every rank steps together and a rank with no live request steps with T = 0 (rank 1 has
none in the first and the last step). FP32: each rank's tokens equal the golden's.
"""
import torch

import pypto.language.distributed as pld
from hand_batches import HandBatches
from pypto_rt.serving.model import DecoderConfig, GoldenDecoder, MoEDecoder, random_state_dict

CFG = DecoderConfig(vocab_size=64, hidden=32, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=8,
                    num_experts=4, top_k=2, moe_intermediate=32, shared_intermediate=32, max_tokens_per_rank=32,
                    block_size=4)
# per rank: its prompts, each step's entries (request, prompt tokens or None for a decode token), new tokens each
PLANS = {
    0: ([[4, 8, 15, 16, 23, 42, 7, 1, 9], [11, 12, 13]],
        [[(0, 5), (1, 3)], [(0, 4), (1, None)], [(0, None), (1, None)], [(0, None), (1, None)]], [3, 4]),
    1: ([[30, 31, 32, 33, 34, 35]],
        [[], [(0, 6)], [(0, None)], []], [2]),
}


def main():
    me, world = pld.rank(), pld.world_size()
    sd = random_state_dict(CFG, seed=7)
    model = MoEDecoder(CFG, sd)
    model.allocate_kv_cache(8)
    prompts, steps, new_tokens = PLANS[me]
    hand = HandBatches(prompts, CFG.block_size, blocks_per_request=4)
    for entries in steps:
        hand.step(model, entries)
    want = GoldenDecoder(CFG, sd).generate(prompts, new_tokens)
    ok = hand.outputs() == want
    print(f"rank {me}/{world}: {'PASS' if ok else 'FAIL'} tokens equal the golden's: {hand.outputs()} vs {want}",
          flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
