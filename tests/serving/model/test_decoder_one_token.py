"""A decode step of one token on one rank runs MoEDecoder in L + 1 fused kernels (kernels.decoder.one_token): the
same logits, tokens, cache contents and per-expert counts as the per-stage kernels, bit for bit, step after step
across block boundaries; the golden model's tokens; and the per-stage path's argument errors."""
import pytest
import torch

from pypto_rt import config
from pypto_rt.kernels.attention import AttentionArgumentError
from pypto_rt.language import _runtime
from pypto_rt.language.decorators import KernelFunction
from pypto_rt.serving.model import DecoderConfig, GoldenDecoder, MoEDecoder, random_state_dict
from tests.serving.model.progs.hand_batches import HandBatches

BLOCK = 4
SMALL = dict(vocab_size=64, hidden=32, num_layers=3, num_q_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
             top_k=2, moe_intermediate=32, shared_intermediate=32, max_tokens_per_rank=32, block_size=BLOCK)


def _models(dtype, **changes):
    cfg = DecoderConfig(**{**SMALL, **changes}, dtype=dtype)
    sd = random_state_dict(cfg, seed=7)
    models = [MoEDecoder(cfg, sd, one_token_kernels=fused) for fused in (True, False)]
    for model in models:
        model.allocate_kv_cache(8)
    return cfg, sd, models


def _entries(model, batch) -> list[str]:
    """The kernels one forward call enters from plain Python, by function name."""
    entries, original = [], KernelFunction.__call__

    def counted(kernel, *args, **kwargs):
        if _runtime.active() is None:
            entries.append(kernel.name.rsplit(".", 1)[-1])
        return original(kernel, *args, **kwargs)

    KernelFunction.__call__ = counted
    try:
        model.forward(batch)
    finally:
        KernelFunction.__call__ = original
    return entries


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_steps_equal_the_per_stage_kernels_bit_for_bit(dtype):
    cfg, _, (fused, staged) = _models(dtype)
    counts = {True: [], False: []}
    for model, key in ((fused, True), (staged, False)):
        model.on_expert_counts = lambda c, layer, key=key: counts[key].append((layer, c.tolist()))
    prompt = [5, 17, 33, 2, 9, 61]
    hands = [HandBatches([prompt], BLOCK, blocks_per_request=4, first_block=2) for _ in range(2)]
    with config.scope(EXECUTOR="compiled"):
        for hand, model in zip(hands, (fused, staged)):
            hand.step(model, [(0, len(prompt))])               # the prompt: a prefill step, per-stage kernels
        for step in range(9):                                  # contexts 7 .. 15: over the block boundary at 8, 12
            batch = hands[0].batch([(0, None)])
            logits = [model.forward_logits(hands[0].batch([(0, None)])) for model in (fused, staged)]
            assert torch.equal(logits[0], logits[1]), (step, (logits[0] - logits[1]).abs().max())
            for hand, model in zip(hands, (fused, staged)):
                hand.step(model, [(0, None)])
            assert torch.equal(fused.key_pool, staged.key_pool) and torch.equal(fused.value_pool, staged.value_pool)
    assert hands[0].outputs() == hands[1].outputs()
    assert counts[True] == counts[False] and len(counts[True]) == 19 * cfg.num_layers
    layers = cfg.num_layers
    assert _entries(fused, batch) == ["one_token_first_layer"] + ["one_token_next_layer"] * (layers - 1) + \
        ["one_token_head"]
    assert len(_entries(staged, batch)) == 4 * layers + 1     # input + cache write, attention, O proj + route, experts


def test_a_one_token_decode_serves_the_goldens_tokens():
    cfg, sd, (fused, _) = _models(torch.float32, num_layers=2)
    prompts = [[3, 9, 27, 81 % 64]]
    hand = HandBatches(prompts, BLOCK, blocks_per_request=4)
    with config.scope(EXECUTOR="compiled"):
        hand.step(fused, [(0, len(prompts[0]))])
        for _ in range(7):
            hand.step(fused, [(0, None)])
    assert hand.outputs() == GoldenDecoder(cfg, sd).generate(prompts, 8)


def test_a_length_past_the_block_table_names_seq_lens_and_a_table_of_another_dtype_names_it():
    _, _, (fused, _) = _models(torch.float32)
    hand = HandBatches([[1, 2, 3]], BLOCK, blocks_per_request=1)
    hand.step(fused, [(0, 3)])
    batch = hand.batch([(0, None)])
    batch.seq_lens[0] = 2 * BLOCK                               # past the one-block table's span ...
    batch.max_seq_len = BLOCK                                   # ... which the host's bound does not say
    with pytest.raises(AttentionArgumentError, match=r"seq_lens\[0\] is 8; it must be at most 4"):
        fused.forward(batch)
    batch = hand.batch([(0, None)])
    batch.block_tables = batch.block_tables.long()
    with pytest.raises(AttentionArgumentError, match="block_tables"):
        fused.forward(batch)
