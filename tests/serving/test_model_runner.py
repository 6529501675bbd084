"""The model runner: bucketed shapes, padded rows that write nothing (slot -1) and read nothing (seq_len 0),
pre-bound buffers reused across steps, stale padding cleared, a warm-up that touches no cache slot."""
from __future__ import annotations

import pytest
import torch

from pypto_rt.serving import Engine, EngineConfig
from pypto_rt.serving.block_table import BlockTable
from pypto_rt.replay.policy import current_policy
from pypto_rt.serving.model_runner import ModelRunner, ServingModel, compile_steps, powers_of_two
from pypto_rt.serving.serving_errors import ServingConfigError
from tests.serving.toy_model import ToyModel


def engine(model, **kw):
    cfg = dict(num_blocks=64, max_batch=8, max_num_batched_tokens=32, max_model_len=64)
    cfg.update(kw)
    return Engine(model, EngineConfig(**cfg))


def check_padding(batch):
    """Rows past the live ones read nothing; tokens past the live ones write nothing."""
    qsl, lens, slots = batch["query_start_loc"], batch["seq_lens"], batch["slot_mapping"]
    live_rows = int((lens > 0).sum())
    live_tokens = int(qsl[live_rows])
    assert (lens[live_rows:] == 0).all()
    assert (slots[live_tokens:] == -1).all() and (slots[:live_tokens] >= 0).all()
    assert (batch["input_ids"][live_tokens:] == 0).all() and (batch["positions"][live_tokens:] == 0).all()
    assert batch["max_seq_len"] == (int(lens.max()) if len(lens) else 0)   # this step's bound
    if batch["is_decode"]:
        assert qsl.tolist() == list(range(len(qsl)))             # T == B: padded row r owns padded token r
    else:
        assert (qsl[live_rows:] == live_tokens).all()           # padded tokens belong to no row
    return live_rows, live_tokens


def test_the_model_sees_only_bucketed_shapes_and_padding_that_reads_and_writes_nothing():
    model = ToyModel()
    eng = engine(model)
    for i in range(5):                                          # 5 requests: decode batches of 5 pad to 8
        eng.add_request([i + 1] * (3 + 4 * i), max_new_tokens=3 + i)
    eng.run()
    shapes = set()
    for batch in model.batches[2:]:                             # after the two warm-up steps
        rows, tokens = batch["seq_lens"].shape[0], batch["input_ids"].shape[0]
        shapes.add((rows, tokens, batch["is_decode"]))
        assert rows in (1, 2, 4, 8) and tokens in ((rows,) if batch["is_decode"] else (16, 32))
        live_rows, _ = check_padding(batch)
        assert live_rows <= rows
    assert (8, 8, True) in shapes and (4, 4, True) in shapes and any(not d for _, _, d in shapes)


def test_steps_of_one_shape_reuse_the_same_tensors():
    model = ToyModel()
    eng = engine(model)
    eng.add_request([1, 2, 3], max_new_tokens=6)
    eng.run()
    decodes = [b["batch"] for b in model.batches if b["is_decode"] and b["seq_lens"].shape[0] == 1]
    assert len(decodes) >= 5 and all(d is decodes[0] for d in decodes)
    assert decodes[0].slot_mapping.data_ptr() == eng.kv.table.slot_mapping.data_ptr()
    assert decodes[0].block_tables.data_ptr() == eng.kv.table.block_tables.data_ptr()


def test_a_shorter_step_leaves_no_stale_token_behind():
    model = ToyModel()
    eng = engine(model, max_batch=4)
    eng.add_request(list(range(1, 14)), max_new_tokens=2)     # a 13-token prefill, then a 1-row decode
    eng.run()
    prefill, decode = model.batches[2], model.batches[3]
    assert prefill["slot_mapping"][:13].ge(0).all() and not prefill["is_decode"]
    assert decode["is_decode"] and decode["input_ids"].shape == (1,)
    assert eng.kv.table.slot_mapping[1:].eq(-1).all()         # the prefill's slots were reset
    check_padding(decode)


def test_warmup_writes_no_slot_and_reads_no_block():
    model = ToyModel()
    engine(model)                                              # warms up
    assert [b["is_decode"] for b in model.batches] == [True, False]
    for batch in model.batches:
        assert (batch["slot_mapping"] == -1).all() and (batch["seq_lens"] == 0).all()
        assert batch["max_seq_len"] == 0
    assert torch.isnan(model.k_cache).all() and torch.isnan(model.v_cache).all()


class TierWatchingModel(ToyModel):
    """Notes the replay policy's tier mode each step runs under."""
    def forward(self, batch):
        out = super().forward(batch)
        self.batches[-1]["tier"] = current_policy().tier
        self.batches[-1]["max_seq_len"] = batch.max_seq_len
        return out


def test_a_compiling_warmup_runs_each_decode_bucket_live_under_the_eager_tier_then_serves_the_same_tokens():
    model = TierWatchingModel(seed=3)
    eng = engine(model, num_blocks=16, max_batch=4, compile_kernels=True)     # decode buckets 1, 2, 4
    padding, live = model.batches[:2], model.batches[2:]
    assert all(b["tier"] == "off" and (b["slot_mapping"] == -1).all() for b in padding)
    steps = compile_steps()
    bounds = eng.runner._context_bounds()      # each size of the decode attention's KV tile, compiled in turn
    assert len(bounds) > 1 and bounds[-1] == eng.kv.table.block_tables.shape[1] * eng.kv.table.block_size
    assert [b["seq_lens"].shape[0] for b in live] == [r for r in (1, 2, 4) for _ in range(steps * len(bounds))]
    assert [b["max_seq_len"] for b in live] == [m for _ in range(3) for m in bounds for _ in range(steps)]
    for b in live:           # live rows of one token each, in distinct slots, under the eager tier
        rows = b["seq_lens"].shape[0]
        assert b["tier"] == "eager" and b["is_decode"] and (b["seq_lens"] == 1).all()
        assert b["slot_mapping"][:rows].tolist() == list(range(rows)) and (b["slot_mapping"][rows:] == -1).all()
    assert (eng.kv.table.slot_mapping == -1).all() and current_policy().tier == "off"
    model.batches.clear()
    reqs = [eng.add_request([5 + i] * (3 + i), max_new_tokens=4) for i in range(3)]
    eng.run()
    assert all(b["tier"] == "off" for b in model.batches)        # serving steps: the policy as the user set it
    for r in reqs:
        assert r.output_ids == model.greedy_reference(r.prompt_ids, r.max_new_tokens)
    small = TierWatchingModel()
    engine(small, num_blocks=1, max_batch=8, max_model_len=4, compile_kernels=True)   # a pool of 4 slots
    assert {b["seq_lens"].shape[0] for b in small.batches[2:]} == {1, 2, 4}     # bucket 8 is left out


def test_buckets_must_reach_the_maximum():
    table = BlockTable(8, 4, 4, 32)
    with pytest.raises(ServingConfigError, match="decode_buckets \\[1, 2, 4\\] must be positive and reach 8"):
        ModelRunner(ToyModel(), table, max_batch=8, max_num_tokens=32, decode_buckets=[4, 2, 1])
    with pytest.raises(ServingConfigError, match="buckets reach 16 rows / 32 tokens; the block table holds 8 rows"):
        ModelRunner(ToyModel(), table, max_batch=8, max_num_tokens=32, decode_buckets=[1, 16])
    with pytest.raises(ServingConfigError, match="buckets reach 8 rows / 64 tokens"):
        ModelRunner(ToyModel(), table, max_batch=8, max_num_tokens=64)
    assert powers_of_two(1, 6) == [1, 2, 4, 6] and powers_of_two(16, 16) == [16]


def test_the_toy_model_satisfies_the_protocol():
    assert isinstance(ToyModel(), ServingModel)
