"""bench.serving_step's eager torch baseline computes the decoder's maths: from the golden's caches, its decode
step gives the golden's tokens (so the benchmark times the same model on both sides)."""
import torch

from bench.serving_step import EagerDecoder
from pypto_rt.serving.model import DecoderConfig, GoldenDecoder, random_state_dict
from pypto_rt.serving.model.golden import RequestCache


def test_the_eager_baseline_decodes_the_goldens_tokens():
    cfg = DecoderConfig(vocab_size=64, hidden=32, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=8,
                        num_experts=4, top_k=2, moe_intermediate=32, shared_intermediate=32)
    golden = GoldenDecoder(cfg, random_state_dict(cfg, seed=3))
    context, batch = 5, 3
    gen = torch.Generator().manual_seed(0)
    eager = EagerDecoder(cfg, golden, batch, gen, context=context)
    caches = [RequestCache(cfg) for _ in range(batch)]
    firsts = [int(golden.step(c, torch.randint(0, 64, (context,), generator=gen).tolist()).argmax()) for c in caches]
    for layer in range(cfg.num_layers):
        for b, cache in enumerate(caches):
            eager.keys[layer][b, :, :context] = cache.keys[layer].transpose(0, 1)
            eager.values[layer][b, :, :context] = cache.values[layer].transpose(0, 1)
    got = eager.step(torch.tensor(firsts), torch.full((batch,), context))
    want = [int(golden.step(c, [t]).argmax()) for c, t in zip(caches, firsts)]
    assert got.tolist() == want
