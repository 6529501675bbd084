"""Benchmark 11 - the KV block manager's host time per decode step at batch 4, 16 and 64 (spec §5.2 item 9):
incremental (`KVCacheManager`: persistent block tables written only where a request gained a block, slots into a
persistent buffer, newly full blocks recorded in the prefix cache) against rebuilding the tables (the same pool
allocation, then the [B, max_blocks] table and the slot mapping built afresh from the block lists every step,
as an engine without persistent buffers does). Block size 16, contexts of 100-400 tokens, max_model_len 2048.

Both are first checked to produce the same table and slots. A sample is WINDOW consecutive decode steps from a
fresh state (setup and the engine's own token bookkeeping untimed); the two contenders alternate; median and best
of the samples. Target: incremental <= 50 µs per step at batch 64. The last column is a whole `Engine.step` in
decode around a model that returns at once: the engine's host work per step.
"""
from __future__ import annotations

import random
import statistics
import time

import torch

from bench.timing import ratio, table, us, verdict
from pypto_rt.serving.block_manager import KVCacheManager, cdiv
from pypto_rt.serving.block_pool import BlockPool
from pypto_rt.serving.request import Request

TITLE = "11. KV block manager: host time per decode step, incremental against rebuilding the tables"
BLOCK, MAX_LEN, WINDOW = 16, 2048, 32
BATCHES = (4, 16, 64)
TARGET_US = 50.0


_clocks = time.perf_counter


def _since(start: float) -> float:
    return time.perf_counter() - start


def _prompts(batch: int) -> list[list[int]]:
    rng = random.Random(batch)
    return [[rng.randrange(32000) for _ in range(rng.randrange(100, 400))] for _ in range(batch)]


class Incremental:
    """The engine's per-step block work with KVCacheManager."""

    def __init__(self, prompts):
        b = len(prompts)
        self.kv = KVCacheManager(b * cdiv(MAX_LEN, BLOCK), BLOCK, b, cdiv(MAX_LEN, BLOCK), max_num_tokens=b)
        self.reqs = [Request(i, p, WINDOW + 1) for i, p in enumerate(prompts)]
        for req in self.reqs:
            assert self.kv.allocate(req, req.num_tokens)
            req.num_computed_tokens = req.num_tokens
            req.token_ids.append(1)
            self.kv.cache_computed(req)

    def step(self) -> float:
        """One decode step; returns the seconds spent in the block manager: allocating (which records the
        blocks the previous step filled: only rows that take a block have one), the slots (not the engine's
        token bookkeeping)."""
        kv = self.kv
        start = _clocks()
        positions = kv.decode_positions()
        grown = kv.grow_rows(kv.rows_needing_blocks(positions))   # as the scheduler's decode path
        kv.table.fill_decode_slots(positions)              # as the runner
        spent = _since(start)
        assert grown, "the pool is sized for every request's whole length"
        for req in kv.rows:                  # the engine's part: the step's token is computed, one is output
            req.num_computed_tokens += 1
            req.token_ids.append(1)
        return spent

    def tensors(self):
        b = len(self.reqs)
        return self.kv.table.block_tables[:b].clone(), self.kv.table.slot_mapping[:b].clone()


class Rebuild:
    """The same allocation from the same pool; tables and slots built afresh each step."""

    def __init__(self, prompts):
        b = len(prompts)
        self.max_blocks = cdiv(MAX_LEN, BLOCK)
        self.pool = BlockPool(b * self.max_blocks, enable_caching=False)
        self.blocks = [[blk.block_id for blk in self.pool.get_new_blocks(cdiv(len(p), BLOCK))] for p in prompts]
        self.lens = [len(p) for p in prompts]        # tokens with K/V (the next one is at this position)
        self.block_tables = self.slot_mapping = None

    def step(self) -> float:
        start = _clocks()
        for blocks, n in zip(self.blocks, self.lens):
            if n // BLOCK == len(blocks):
                blocks.append(self.pool.get_new_blocks(1)[0].block_id)
        self.block_tables = torch.tensor([blocks + [0] * (self.max_blocks - len(blocks)) for blocks in self.blocks],
                                         dtype=torch.int32)
        pos = torch.tensor(self.lens, dtype=torch.int64)
        self.slot_mapping = (self.block_tables.gather(1, (pos // BLOCK).unsqueeze(1)).squeeze(1).long() * BLOCK
                             + pos % BLOCK)
        spent = _since(start)
        self.lens = [n + 1 for n in self.lens]
        return spent

    def tensors(self):
        return self.block_tables, self.slot_mapping


class _InstantModel:
    """A ServingModel that returns at once: what is left of a step is the engine's host work."""
    block_size = BLOCK

    def allocate_kv_cache(self, num_blocks: int) -> None:
        pass

    def forward(self, batch):
        return torch.ones(batch.num_requests, dtype=torch.int64)


def engine_step(batch: int, steps: int = 4 * WINDOW) -> float:
    """Median seconds of a whole `Engine.step` in decode (scheduler, runner, update) with an instant model."""
    from pypto_rt.serving import Engine, EngineConfig

    engine = Engine(_InstantModel(), EngineConfig(num_blocks=batch * cdiv(MAX_LEN, BLOCK), max_batch=batch,
                                                  max_num_batched_tokens=max(batch, 256), max_model_len=MAX_LEN))
    for prompt in _prompts(batch):
        engine.add_request(prompt, steps + 2)
    while engine.scheduler.waiting or any(r.num_pending > 1 for r in engine.kv.rows):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _check(batch: int) -> None:
    inc, reb = Incremental(_prompts(batch)), Rebuild(_prompts(batch))
    for _ in range(WINDOW):
        inc.step()
        reb.step()
        for a, b in zip(inc.tensors(), reb.tensors()):
            assert torch.equal(a, b), "incremental and rebuilt tables differ"


def _sample(cls, prompts) -> float:
    state = cls(prompts)
    return sum(state.step() for _ in range(WINDOW)) / WINDOW


def measure(batch: int, repeats: int) -> dict[str, tuple[float, float]]:
    """(median, best) seconds per step of each contender, over windows of WINDOW steps."""
    _check(batch)
    prompts = _prompts(batch)
    times = {"incremental": [], "rebuild": []}
    for _ in range(repeats):
        for name, cls in (("incremental", Incremental), ("rebuild", Rebuild)):
            times[name].append(_sample(cls, prompts))
    return {name: (statistics.median(ts), min(ts)) for name, ts in times.items()}


def run(repeats: int = 25) -> str:
    rows = []
    for batch in BATCHES:
        t = measure(batch, repeats)
        (inc, inc_best), (reb, reb_best) = t["incremental"], t["rebuild"]
        target = f"≤ {TARGET_US:.0f} µs: {verdict(inc * 1e6, TARGET_US)}" if batch == 64 else "-"
        rows.append((batch, f"{us(inc)} ({us(inc_best)})", f"{us(reb)} ({us(reb_best)})", ratio(inc / reb), target,
                     us(engine_step(batch))))
    return table(("batch", "incremental: median (best)", "rebuild: median (best)", "incremental / rebuild",
                  "target (median)", "whole engine step"), rows) + (
        f"\n\nHost time per decode step, over {repeats} windows of {WINDOW} steps each; best = the quickest window "
        "(on a shared machine, the one least disturbed by other jobs). Whole engine step: the median of "
        f"{4 * WINDOW} `Engine.step` calls in decode with a model that returns at once (scheduler, runner buffers, "
        "token bookkeeping, metrics).")


if __name__ == "__main__":
    print(run())
