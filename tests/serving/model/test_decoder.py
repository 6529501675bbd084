"""MoEDecoder.forward, stepped by hand (tests/serving/model/progs/hand_batches.py), against GoldenDecoder: in FP32
the same tokens for requests of different lengths (block boundaries, chunked prefill over two steps, mixed steps,
padding rows, a step with no tokens); in bf16 and W8A8 the logits within a stated tolerance."""
import pytest
import torch

from pypto_rt.serving.model import (DecoderConfig, DecoderConfigError, DecoderError, GoldenDecoder, MoEDecoder,
                                    random_state_dict)
from pypto_rt.serving.batch import ForwardBatch
from pypto_rt.serving.model.golden import RequestCache
from tests.serving.model.progs.hand_batches import PAD, HandBatches

BLOCK = 4
SMALL = dict(vocab_size=64, hidden=32, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
             top_k=2, moe_intermediate=32, shared_intermediate=32, max_tokens_per_rank=32, block_size=BLOCK)
# the largest absolute logit difference allowed (the logits here reach about 3): bf16 rounds every layer's output
# to 8 mantissa bits, so other FP32 summation orders than the golden's can round a value 1 ulp apart, and with W8A8
# experts such a difference can move an activation to the next int8 level (measured: 0.015 bf16, 0.052 int8)
LOGIT_TOLERANCE = {"bf16": 0.05, "int8": 0.15}


@pytest.fixture(scope="module")
def fp32_model():
    cfg = DecoderConfig(**SMALL)
    sd = random_state_dict(cfg, seed=0)
    model = MoEDecoder(cfg, sd)
    model.allocate_kv_cache(16)
    return model, GoldenDecoder(cfg, sd)


def test_prefill_then_decode_steps_give_the_goldens_tokens(fp32_model):
    model, golden = fp32_model
    prompts = [[3], [5, 6, 7, 8], [9, 10, 11, 12, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9]]   # 1, block, block + 1, 2 blocks + 1
    hand = HandBatches(prompts, BLOCK, blocks_per_request=4)
    hand.step(model, [(i, len(p)) for i, p in enumerate(prompts)])
    for _ in range(4):
        hand.step(model, [(i, None) for i in range(len(prompts))])
    assert hand.outputs() == golden.generate(prompts, 5)


def test_chunked_prefill_over_two_steps_mixed_steps_and_padding_rows(fp32_model):
    model, golden = fp32_model
    prompts = [[4, 8, 15, 16, 23, 42, 7, 1, 9], [11, 12, 13]]
    hand = HandBatches(prompts, BLOCK, blocks_per_request=4, first_block=4)
    hand.step(model, [(0, 5), (1, 3)])                  # request 0's first chunk; request 1 whole
    hand.step(model, [(1, None), (0, 4)])               # request 1 decodes while request 0 finishes its prompt
    hand.step(model, [(0, None), PAD, (1, None)])       # a padding row between live ones
    hand.step(model, [(0, None), (1, None), PAD])
    assert hand.outputs() == golden.generate(prompts, [3, 4])


def test_a_step_with_no_tokens_returns_no_tokens(fp32_model):
    model, _ = fp32_model
    empty = ForwardBatch(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                         torch.zeros(0, dtype=torch.int64), torch.zeros(0, 4, dtype=torch.int32),
                         torch.zeros(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), True)
    tokens = model.forward(empty)
    assert tokens.shape == (0,) and tokens.dtype == torch.int64


@pytest.mark.parametrize("quantize", [False, True], ids=["bf16", "int8"])
def test_bf16_and_int8_logits_stay_within_the_tolerance(quantize):
    cfg = DecoderConfig(**SMALL, dtype=torch.bfloat16, quantize=quantize)
    sd = random_state_dict(cfg, seed=1)
    model, golden = MoEDecoder(cfg, sd), GoldenDecoder(cfg, sd)
    model.allocate_kv_cache(8)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
    hand = HandBatches(prompts, BLOCK, blocks_per_request=4)
    caches = [RequestCache(cfg) for _ in prompts]
    want = torch.stack([golden.step(c, p) for c, p in zip(caches, prompts)])
    got = model.forward_logits(hand.batch([(i, len(p)) for i, p in enumerate(prompts)]))
    tolerance = LOGIT_TOLERANCE["int8" if quantize else "bf16"]
    assert (got - want).abs().max() <= tolerance, (got - want).abs().max()
    for req, logits, p in zip(hand.requests, want, prompts):       # decode the golden's token on both sides
        req.fed, req.out = len(p), [int(logits.argmax())]
    want = torch.stack([golden.step(c, r.out) for c, r in zip(caches, hand.requests)])
    got = model.forward_logits(hand.batch([(0, None), (1, None)]))
    assert (got - want).abs().max() <= tolerance, (got - want).abs().max()


def test_a_step_before_the_cache_is_allocated_says_what_to_call():
    cfg = DecoderConfig(**SMALL)
    model = MoEDecoder(cfg, random_state_dict(cfg, seed=2))
    with pytest.raises(DecoderError, match="no KV cache") as caught:
        model.forward(HandBatches([[1]], BLOCK, 1).batch([(0, 1)]))
    assert "allocate_kv_cache" in caught.value.hint and caught.value.span.file == __file__


def test_a_request_longer_than_the_rotary_table_is_refused_before_any_kernel_runs():
    cfg = DecoderConfig(**{**SMALL, "max_positions": 4})
    model = MoEDecoder(cfg, random_state_dict(cfg, seed=2))
    model.allocate_kv_cache(4)
    with pytest.raises(DecoderError, match="reaches 5 tokens, over max_positions=4") as caught:
        model.forward(HandBatches([[1, 2, 3, 4, 5]], BLOCK, 2).batch([(0, 5)]))
    assert caught.value.span.file == __file__


def test_a_slot_past_the_kv_pool_is_refused_at_the_callers_line():
    """The cache write inside the attention-input kernel trusts its slots: the decoder checks them first."""
    import dataclasses
    cfg = DecoderConfig(**SMALL)
    model = MoEDecoder(cfg, random_state_dict(cfg, seed=2))
    model.allocate_kv_cache(4)
    batch = HandBatches([[1, 2]], BLOCK, 2).batch([(0, 2)])
    batch = dataclasses.replace(batch, slot_mapping=torch.tensor([0, 4 * BLOCK], dtype=torch.int64))
    with pytest.raises(DecoderError, match=f"slot {4 * BLOCK}, outside the pool's {4 * BLOCK} slots") as caught:
        model.forward(batch)
    assert caught.value.span.file == __file__


def test_a_config_that_cannot_be_built_names_the_field():
    with pytest.raises(DecoderConfigError, match="num_kv_heads=3 does not divide num_q_heads=4") as caught:
        DecoderConfig(**{**SMALL, "num_kv_heads": 3})
    assert caught.value.span.file == __file__


def test_each_layers_rows_per_expert_reach_on_expert_counts(fp32_model):
    model, _ = fp32_model
    seen = []
    model.on_expert_counts = lambda counts, layer: seen.append((layer, counts.clone()))
    try:
        prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
        hand = HandBatches(prompts, BLOCK, blocks_per_request=4, first_block=8)
        hand.step(model, [(0, 3), (1, 5)])
    finally:
        model.on_expert_counts = None
    cfg = model.cfg
    assert [layer for layer, _ in seen] == list(range(cfg.num_layers))
    for _, counts in seen:      # one rank holds every expert: each of the 8 tokens' top_k routes is a row
        assert counts.shape == (cfg.num_experts,) and int(counts.sum()) == 8 * cfg.top_k


@pytest.mark.parametrize("pad_at", ["end", "middle"])
def test_padding_tokens_are_not_routed_to_experts(fp32_model, pad_at):
    """A padded decode step (the model runner pads at the end; a hand-made batch anywhere) runs MoE on the live
    tokens only: the per-expert counts hold their routes and no padding token's, and the tokens stay the golden's."""
    model, golden = fp32_model
    seen = []
    model.on_expert_counts = lambda counts, layer: seen.append(int(counts.sum()))
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    try:
        hand = HandBatches(prompts, BLOCK, blocks_per_request=4, first_block=8)
        hand.step(model, [(0, 3), (1, 5)])
        seen.clear()
        rows = [(0, None), (1, None), PAD, PAD] if pad_at == "end" else [(0, None), PAD, (1, None), PAD]
        hand.step(model, rows)
    finally:
        model.on_expert_counts = None
    assert seen == [2 * model.cfg.top_k] * model.cfg.num_layers       # 2 live tokens of 4
    assert hand.outputs() == golden.generate(prompts, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_decode_batch_of_16_takes_the_routed_moe_form_and_keeps_the_goldens_tokens(monkeypatch, dtype):
    """8 experts top-2 at 16 decode rows: the MoE layer's routed capacity form (10 slots per expert), its tokens in
    FP32 the golden's, its logits in bf16 within the tolerance."""
    from pypto_rt.kernels.moe import layer as layer_module
    routed = []
    factory = layer_module.local_routed_kernel
    monkeypatch.setattr(layer_module, "local_routed_kernel", lambda *shape: routed.append(shape[1]) or factory(*shape))
    cfg = DecoderConfig(**{**SMALL, "num_experts": 8}, dtype=dtype)
    sd = random_state_dict(cfg, seed=2)
    model, golden = MoEDecoder(cfg, sd), GoldenDecoder(cfg, sd)
    model.allocate_kv_cache(32)
    prompts = [[(7 * i) % 64, (5 * i + 3) % 64] for i in range(16)]
    hand = HandBatches(prompts, BLOCK, blocks_per_request=2)
    if dtype == torch.float32:
        hand.step(model, [(i, 2) for i in range(16)])
        for _ in range(3):
            hand.step(model, [(i, None) for i in range(16)])
        assert hand.outputs() == golden.generate(prompts, 4)
    else:
        caches = [RequestCache(cfg) for _ in prompts]
        want = torch.stack([golden.step(c, p) for c, p in zip(caches, prompts)])
        model.forward(hand.batch([(i, 2) for i in range(16)]))
        for req, logits, p in zip(hand.requests, want, prompts):     # decode the golden's token on both sides
            req.fed, req.out = len(p), [int(logits.argmax())]
        want = torch.stack([golden.step(c, r.out) for c, r in zip(caches, hand.requests)])
        got = model.forward_logits(hand.batch([(i, None) for i in range(16)]))
        assert (got - want).abs().max() <= LOGIT_TOLERANCE["bf16"], (got - want).abs().max()
    assert 16 in routed, routed


def test_a_decode_step_sizes_its_attention_by_the_batchs_max_seq_len(fp32_model, monkeypatch):
    """The runner's max_seq_len (the host's number) reaches the paged decode, which sizes its KV tile by it; a batch
    without one gives the longest seq_lens entry."""
    from pypto_rt.kernels import attention
    model, _ = fp32_model
    seen = []

    class Spy:
        write_kv_cache, chunked_prefill_attention = attention.write_kv_cache, attention.chunked_prefill_attention

        @staticmethod
        def paged_decode_attention(*args, **kwargs):
            seen.append(kwargs.get("max_seq_len"))
            return attention.paged_decode_attention(*args, **kwargs)

    hand = HandBatches([[1, 2, 3], [4, 5, 6, 7, 8]], BLOCK, blocks_per_request=4)
    hand.step(model, [(0, 3), (1, 5)])
    batch = hand.batch([(0, None), (1, None)])
    monkeypatch.setattr(model, "attention", Spy)
    model.forward(batch)
    batch.max_seq_len = 16                                  # a bound above the lengths: passed on as it is
    model.forward(batch)
    assert seen == [6, 6, 16, 16], seen                     # two layers a step
