"""The engine end to end: every request's tokens equal a plain greedy loop over the same model, with chunked
prefill, shared prefixes, eos, preemption; stepping on while another rank works; errors; progress."""
from __future__ import annotations

import io
import random

import pytest

from pypto_rt.serving import Engine, EngineConfig
from pypto_rt.serving.serving_errors import RequestTooLargeError, ServingConfigError, ServingError
from tests.serving.toy_model import ToyModel


def workload(n, seed, vocab=64):
    """n prompts of 1..20 tokens, every other one after a shared 10-token system prompt."""
    rng = random.Random(seed)
    shared = [rng.randrange(vocab) for _ in range(10)]
    return [((shared if i % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randrange(1, 21))],
             rng.randrange(1, 16)) for i in range(n)]


@pytest.mark.parametrize("num_blocks", [96, 14])          # roomy, and small enough to preempt
def test_every_request_matches_a_plain_greedy_loop(num_blocks):
    model = ToyModel(seed=1)
    eng = Engine(model, EngineConfig(num_blocks=num_blocks, max_batch=8, max_num_batched_tokens=16,
                                     max_model_len=64))
    reqs = [eng.add_request(prompt, n) for prompt, n in workload(24, seed=num_blocks)]
    finished = eng.run()
    assert sorted(r.request_id for r in finished) == list(range(24))
    for r in reqs:
        assert r.output_ids == model.greedy_reference(r.prompt_ids, r.max_new_tokens), r.request_id
    m = eng.metrics.summary_dict()
    assert m["prefix_hit_rate"] > 0 and m["output_tokens"] == sum(len(r.output_ids) for r in reqs)
    assert (m["preemptions"] > 0) == (num_blocks == 14)
    assert eng.kv.pool.num_free == num_blocks


def test_requests_stop_at_their_eos_id():
    model = ToyModel(seed=2)
    prompt = [3, 1, 4, 1, 5]
    free_run = model.greedy_reference(prompt, 12)
    eos = free_run[4]
    eng = Engine(model, EngineConfig(num_blocks=32, max_batch=4, max_num_batched_tokens=8, max_model_len=32))
    req = eng.add_request(prompt, 12, eos_id=eos)
    eng.run()
    assert req.output_ids == free_run[:free_run.index(eos) + 1]


def test_generate_yields_requests_as_they_finish():
    eng = Engine(ToyModel(), EngineConfig(num_blocks=32, max_batch=4, max_num_batched_tokens=8, max_model_len=32))
    long_one = eng.add_request([1, 2], 6)
    short = eng.add_request([3, 4], 1)
    assert [r.request_id for r in eng.generate()] == [short.request_id, long_one.request_id]


def test_a_done_rank_keeps_stepping_empty_while_another_rank_works():
    model = ToyModel()
    eng = Engine(model, EngineConfig(num_blocks=32, max_batch=4, max_num_batched_tokens=8, max_model_len=32))
    eng.add_request([1, 2, 3], 2)
    other_rank_busy = iter([False, False, False, True])     # the other rank finishes later
    calls = []

    def done_everywhere(local_done):
        calls.append(local_done)
        return local_done and next(other_rank_busy)

    eng.run(done_everywhere)
    assert calls == [False, False, True, True, True, True]
    empty = [b for b in model.batches[2:] if b["input_ids"].shape == (0,)]
    assert len(empty) == 3 and eng.metrics.empty_steps == 3


def test_bad_requests_and_configs_say_what_to_change():
    eng = Engine(ToyModel(), EngineConfig(num_blocks=4, max_batch=2, max_num_batched_tokens=4, max_model_len=64))
    with pytest.raises(RequestTooLargeError, match="needs 6 KV blocks of 4 tokens; the pool has 4") as err:
        eng.add_request(list(range(20)), 4)
    assert "raise EngineConfig.num_blocks" in str(err.value)
    assert err.value.span.file == __file__ and "eng.add_request(list(range(20)), 4)" in str(err.value)
    with pytest.raises(ServingError, match="non-empty prompt"):
        eng.add_request([], 4)
    with pytest.raises(ServingConfigError, match="EngineConfig.num_blocks must be >= 1"):
        Engine(ToyModel(), EngineConfig(num_blocks=0))
    with pytest.raises(ServingConfigError, match="object is not a ServingModel: it lacks one of block_size"):
        Engine(object(), EngineConfig())


def test_progress_lines_and_summary():
    out = io.StringIO()
    eng = Engine(ToyModel(), EngineConfig(num_blocks=32, max_batch=4, max_num_batched_tokens=8, max_model_len=32,
                                          progress_interval_s=0.0), progress_stream=out)
    for prompt, n in workload(4, seed=5):
        eng.add_request(prompt[:6], min(n, 4))
    eng.run()
    lines = out.getvalue().splitlines()
    assert len(lines) == eng.metrics.steps and lines[-1].startswith("[serve] step")
    assert "done    4" in lines[-1]
    summary = eng.metrics.summary()
    assert "output tok/s" in summary and "TTFT p50" in summary and "prefix-cache hit rate" in summary
