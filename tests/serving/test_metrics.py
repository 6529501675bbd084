"""Serving metrics: TTFT/TPOT from request times, percentiles, throughput over the stepping time, batch sizes,
per-expert token counts through the model's hook."""
from __future__ import annotations

import math

import pytest
import torch

from pypto_rt.serving import Engine, EngineConfig
from pypto_rt.serving.metrics import ServingMetrics, percentile
from pypto_rt.serving.request import Request
from tests.serving.toy_model import ToyModel


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_percentiles():
    assert percentile([], 50) != percentile([], 50)           # nan
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isclose(percentile(list(map(float, range(101))), 99), 99.0)


def test_ttft_tpot_and_throughput_from_the_clock():
    clock = FakeClock()
    m = ServingMetrics(clock)
    req = Request(0, [1, 2], 3, arrival_time=0.0)
    clock.now = 0.5
    m.on_step(live_rows=1, fed_tokens=2, new_tokens=1, seconds=0.5)    # prefill from 0.0 to 0.5
    req.token_ids += [7, 8, 9]
    req.first_token_time, req.finish_time = 0.5, 1.5
    clock.now = 1.5
    m.on_step(live_rows=1, fed_tokens=1, new_tokens=1, seconds=0.5)
    m.on_step(live_rows=0, fed_tokens=0, new_tokens=0, seconds=0.0)
    m.on_finish(req)
    s = m.summary_dict()
    assert s["ttft_p50_s"] == 0.5 and s["tpot_p50_s"] == 0.5          # (1.5 - 0.5) / (3 - 1)
    assert s["elapsed_s"] == 1.5 and s["output_tokens"] == 2 and s["fed_tokens"] == 3
    assert s["empty_steps"] == 1 and s["batch_mean"] == 1.0 and s["steps"] == 3


class CountingToy(ToyModel):
    """A toy that reports two 'experts': even and odd token ids fed in each step."""
    on_expert_counts = None

    def forward(self, batch):
        ids = batch.input_ids[batch.slot_mapping >= 0]
        self.on_expert_counts(torch.stack([(ids % 2 == 0).sum(), (ids % 2 == 1).sum()]), layer=0)
        return super().forward(batch)


@pytest.mark.parametrize("compile_kernels", [False, True])   # (its warm-up's live dummy rows are not counted)
def test_expert_counts_reach_the_summary_through_the_model_hook(compile_kernels):
    model = CountingToy()
    eng = Engine(model, EngineConfig(num_blocks=16, max_batch=2, max_num_batched_tokens=8, max_model_len=32,
                                     compile_kernels=compile_kernels))
    req = eng.add_request([2, 4, 6, 1], 3)
    eng.run()
    fed = req.token_ids[:-1]                                   # every token but the last went through the model
    s = eng.metrics.summary_dict()
    assert s["expert_tokens"] == [sum(t % 2 == 0 for t in fed), sum(t % 2 == 1 for t in fed)]
    assert "tokens per expert" in eng.metrics.summary()
