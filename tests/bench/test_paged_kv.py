"""Benchmark 14 runs end to end at a small context: its contenders (the paged kernels, the contiguous-cache
kernels in the DSL, eager torch) pass their golden checks (including the write's untouched padding and last
slots, and the DSL append's rows) and both tables come out."""
from bench import paged_kv


def test_paged_kv_benchmark_runs_at_a_small_context():
    body = paged_kv.run(repeats=1, contexts=(32,), blocks=(16,))
    assert "paged / DSL contiguous" in body and "paged write / DSL contiguous append" in body
    assert body.count("| 32 | 16 |") == 4          # two read dtypes, two write paddings


def _replayed_calls(call) -> int:
    import re
    from pypto_rt import run_stats
    from pypto_rt.run_stats import REPLAYED
    with run_stats.collect() as stats:
        call()
    assert stats.replay.kind == REPLAYED, stats.replay
    return int(re.search(r"replay of (\d+) torch calls", stats.replay.reason).group(1))


def test_the_paged_write_replays_in_no_more_torch_calls_than_the_contiguous_append():
    """The write is one row mscatter per cache that skips -1 slots (through a spare row found in O(n) and put back)
    and does not order repeated slots (42 calls against the append's 25 before, 18 now): at most the append's."""
    import torch
    from pypto_rt import config
    from pypto_rt.replay.policy import ReplayPolicy, policy_scope
    pool = paged_kv._Pool(32, 16, torch.float32)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        fns = paged_kv._write(pool, padded=True)
        for _ in range(ReplayPolicy().normal_runs + 2 * ReplayPolicy().trial_replays + 2):
            fns["paged"](), fns["dsl_contiguous"]()
        paged, append = _replayed_calls(fns["paged"]), _replayed_calls(fns["dsl_contiguous"])
    assert paged <= append, (paged, append)


def test_the_cpu_time_write_table_runs_at_a_small_context():
    from pypto_rt.replay.policy import policy_scope
    with policy_scope(slower=float("inf"), parallel=float("inf")):
        body = paged_kv.cpu_write(repeats=1, calls=2, contexts=(32,), blocks=(16,))
    assert "paged write / DSL append (25% -1)" in body and body.count("| 32 | 16 |") == 1
