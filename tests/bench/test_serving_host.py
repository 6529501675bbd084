"""bench.serving_host: the incremental block manager and the rebuilding baseline give the same tables and slots,
and the benchmark prints its table (one repeat, no timing asserted)."""
from __future__ import annotations

import torch

from bench import serving_host


def test_incremental_and_rebuilt_tables_agree_across_block_boundaries():
    inc, reb = serving_host.Incremental(serving_host._prompts(5)), serving_host.Rebuild(serving_host._prompts(5))
    for _ in range(serving_host.WINDOW):       # 32 steps of block 16: every row crosses a block boundary
        inc.step()
        reb.step()
        for a, b in zip(inc.tensors(), reb.tensors()):
            assert torch.equal(a, b)
    assert all(len(req.blocks) > 1 for req in inc.reqs) and inc.kv.pool.cached


def test_the_benchmark_prints_one_row_per_batch(monkeypatch):
    monkeypatch.setattr(serving_host, "BATCHES", (2, 3))
    out = serving_host.run(repeats=1)
    lines = out.splitlines()
    assert lines[0].startswith("| batch | incremental: median (best) | rebuild: median (best)")
    assert [line.split(" | ")[0] for line in lines[2:4]] == ["| 2", "| 3"] and "1 windows of 32 steps" in out
