"""The serving engine's compiling warm-up over MoEDecoder (EngineConfig.compile_kernels): every kernel of the
decode step is taken through the compiled tier's trial before the first request, and the served FP32 tokens are
the golden model's. Compiles take seconds each here (a scratch compiler cache: every graph is built cold)."""
import gc

import torch

from pypto_rt import config
from pypto_rt.replay.tier import FAILED, Tier
from pypto_rt.serving import Engine, EngineConfig
from pypto_rt.serving.model import DecoderConfig, GoldenDecoder, MoEDecoder, random_state_dict

TINY = dict(vocab_size=64, hidden=32, num_layers=1, num_q_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
            top_k=2, moe_intermediate=32, shared_intermediate=32, max_tokens_per_rank=16, block_size=4)

# (max_batch=1: every decode step is one token, whose one layer runs in the one-token kernels, kernels.decoder)
DECODE_KERNELS = (".one_token_first_layer", ".one_token_head")


def all_tiers() -> list[Tier]:
    return [t for t in gc.get_objects() if type(t) is Tier]


def fresh_kernels() -> None:
    """Forget the kernels other tests made at these shapes (their specialisations' replays and tiers): this test is
    the first model of a serving process. (Seen in a full run: after other decoder tests, the warm-up left the
    cache write's and the hit experts' tiers of the same shapes undecided; to be investigated.)"""
    import sys
    for name, module in list(sys.modules.items()):
        if name.startswith(("pypto_rt.kernels.attention.", "pypto_rt.kernels.layers.", "pypto_rt.kernels.moe.",
                            "pypto_rt.kernels.decoder.")):
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)) and getattr(value, "__name__", "").endswith("kernel"):
                    value.cache_clear()


def test_a_compiling_warmup_decides_every_decode_kernels_tier_and_serves_the_goldens_tokens():
    fresh_kernels()
    cfg = DecoderConfig(**TINY, dtype=torch.float32)
    sd = random_state_dict(cfg, seed=4)
    # (other tests' tiers of these kernels: at other shapes, or at these shapes already, then taken on by the warm-up)
    before = {id(t): (t.state, t.chosen is not None) for t in all_tiers()}
    with config.scope(EXECUTOR="compiled", TIER="off"):
        model = MoEDecoder(cfg, sd)
        engine = Engine(model, EngineConfig(num_blocks=16, max_batch=1, max_num_batched_tokens=16,
                                            max_model_len=32, compile_kernels=True))
        # the decode step's kernels (the all-padding steps before, T = 0, run others: not compiled)
        mine = [t for t in all_tiers() if t.entry.endswith(DECODE_KERNELS)]
        made = [t for t in mine if before.get(id(t)) != (t.state, t.chosen is not None)]   # new or moved on
        names = " ".join(t.entry for t in mine if t in made or t.chosen is not None)
        for kernel in DECODE_KERNELS:
            assert kernel in names, f"{kernel} has no tier after the warm-up: {names} "
        for t in made:
            assert t.chosen is not None and t.state != FAILED, f"{t.entry}: {t.text}"
        assert any(t.tiered is not None for t in made)
        prompts = [[3, 9, 27], [5, 6, 7, 8, 1]]
        reqs = [engine.add_request(p, max_new_tokens=5) for p in prompts]
        engine.run()
    golden = GoldenDecoder(cfg, sd).generate(prompts, 5)
    assert [r.output_ids for r in reqs] == golden
