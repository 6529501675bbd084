"""Benchmark 14 runs end to end at a small context: its contenders (the paged kernels, the contiguous-cache
kernels in the DSL, eager torch) pass their golden checks (including the write's untouched padding and last
slots, and the DSL append's rows) and both tables come out."""
from bench import paged_kv


def test_paged_kv_benchmark_runs_at_a_small_context():
    body = paged_kv.run(repeats=1, contexts=(32,), blocks=(16,))
    assert "paged / DSL contiguous" in body and "paged write / DSL contiguous append" in body
    assert body.count("| 32 | 16 |") == 4          # two read dtypes, two write paddings
