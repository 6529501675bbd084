"""The scheduler: the token budget, requests joining and leaving every step, chunked prefill, decodes first,
preemption by recompute (and the same tokens after resuming), empty steps."""
from __future__ import annotations

import pytest

from pypto_rt.serving import Engine, EngineConfig
from pypto_rt.serving.block_manager import KVCacheManager
from pypto_rt.serving.request import Request, RequestStatus
from pypto_rt.serving.scheduler import Scheduler
from pypto_rt.serving.serving_errors import ServingConfigError
from tests.serving.toy_model import ToyModel


def scheduler(num_blocks=32, max_batch=4, budget=8):
    kv = KVCacheManager(num_blocks, 4, max_batch, 16, max_num_tokens=budget)
    return Scheduler(kv, budget)


def advance(step):
    """What the engine does after the model ran: tokens computed, a new token where a request reached its end."""
    for req, n in step.rows:
        req.num_computed_tokens += n
        if n and req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(1)


def test_long_prompts_are_chunked_under_the_budget():
    s = scheduler(budget=8)
    a, b = Request(0, list(range(13)), 2), Request(1, list(range(20, 25)), 2)
    s.add(a)
    s.add(b)
    chunks = []
    for _ in range(4):
        step = s.schedule()
        assert step.num_tokens <= 8
        chunks.append([(req.request_id, n) for req, n in step.rows])
        advance(step)
    # a's 13 tokens in chunks of 8 and 5; b joins with what is left of the budget; then both decode
    assert chunks == [[(0, 8)], [(0, 5), (1, 3)], [(0, 1), (1, 2)], [(0, 1), (1, 1)]]


def test_decodes_are_scheduled_before_a_prefill_chunk_takes_the_budget():
    s = scheduler(budget=4)
    a = Request(0, [1, 2], 5)
    s.add(a)
    advance(s.schedule())                               # a prefilled, now in decode
    long_one, late = Request(1, list(range(10)), 2), Request(2, [3], 3)
    s.add(long_one)
    advance(s.schedule())                               # long_one's first chunk: 3 tokens (a decodes)
    s.add(late)
    step = s.schedule()
    rows = {req.request_id: n for req, n in step.rows}
    assert rows[0] == 1 and rows[1] == 3 and step.num_tokens == 4
    assert 2 not in rows and s.waiting[0] is late       # no budget left: late waits


def test_requests_join_and_leave_every_step():
    model = ToyModel()
    engine = Engine(model, EngineConfig(num_blocks=64, max_batch=3, max_num_batched_tokens=16, max_model_len=64))
    first = [engine.add_request([i + 1, i + 2], max_new_tokens=i + 1) for i in range(3)]
    live = []
    for step in range(6):
        if step == 2:
            late = engine.add_request([9, 9, 9], max_new_tokens=2)
        engine.step()
        live.append(sorted(r.request_id for r in engine.kv.rows))
    assert live == [[1, 2], [2], [3], [], [], []]
    assert all(r.status is RequestStatus.FINISHED for r in first + [late])
    assert [r.output_ids for r in first + [late]] == [
        model.greedy_reference(r.prompt_ids, r.max_new_tokens) for r in first + [late]]


def test_exhaustion_preempts_the_last_row_and_resumption_gives_the_same_tokens():
    model = ToyModel(seed=3)
    # 6 blocks of 4 slots: three requests of 3 + 12 tokens cannot all keep their blocks
    engine = Engine(model, EngineConfig(num_blocks=6, max_batch=3, max_num_batched_tokens=8, max_model_len=32))
    reqs = [engine.add_request([5 * i + 1, 5 * i + 2, 5 * i + 3], max_new_tokens=12) for i in range(3)]
    preempted_ids = []
    while engine.has_unfinished():
        step_before = engine.metrics.preemptions
        engine.step()
        if engine.metrics.preemptions > step_before:
            preempted_ids.append(engine.scheduler.waiting[0].request_id)
    assert engine.metrics.preemptions > 0 and 2 in preempted_ids      # the last row goes first
    assert sum(r.num_preemptions for r in reqs) == engine.metrics.preemptions
    for r in reqs:
        assert r.output_ids == model.greedy_reference(r.prompt_ids, 12)
    assert engine.kv.pool.num_free == 6 and engine.kv.rows == []


def test_a_preempted_request_goes_back_to_the_front_without_blocks():
    s = scheduler(num_blocks=2, max_batch=2, budget=8)
    a, b = Request(0, [1, 2, 3], 6), Request(1, [4, 5, 6], 6)
    s.add(a)
    s.add(b)
    advance(s.schedule())                                # each holds 1 block, both now decode at position 3
    advance(s.schedule())                                # position 3 fits in the first block
    step = s.schedule()                                  # position 4: a takes the last free block, b must go
    assert step.preempted == [b] and [r for r, _ in step.rows] == [a]
    assert b.status is RequestStatus.WAITING and b.blocks == [] and b.num_computed_tokens == 0
    assert list(s.waiting) == [b] and b.row == -1


def test_a_rank_with_nothing_to_run_still_steps_with_an_empty_batch():
    model = ToyModel()
    engine = Engine(model, EngineConfig(num_blocks=8, max_batch=2, max_num_batched_tokens=4, max_model_len=16))
    model.batches.clear()
    engine.step()
    (seen,) = model.batches
    assert seen["input_ids"].shape == (0,) and seen["block_tables"].shape == (0, 4)
    assert seen["query_start_loc"].tolist() == [0] and engine.metrics.empty_steps == 1


def test_budget_below_the_batch_is_refused():
    kv = KVCacheManager(8, 4, 8, 4, max_num_tokens=4)
    with pytest.raises(ServingConfigError, match="max_num_batched_tokens 4 is below max_batch 8"):
        Scheduler(kv, 4)
