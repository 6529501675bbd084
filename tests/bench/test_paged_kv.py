"""Benchmark 14 runs end to end at a small context: its contenders (the paged kernels, the contiguous-cache
kernels in the DSL, eager torch) pass their golden checks (including the write's untouched padding and last
slots, and the DSL append's rows) and both tables come out; the append it compares the write with is as lean."""
from bench import paged_kv


def test_paged_kv_benchmark_runs_at_a_small_context():
    body = paged_kv.run(repeats=1, contexts=(32,), blocks=(16,))
    assert "paged / DSL contiguous" in body and "write_kv_cache / append_kv" in body
    assert body.count("| 32 | 16 |") == 4          # two read dtypes, two write paddings


def _replayed_calls(call) -> int:
    import re
    from pypto_rt import run_stats
    from pypto_rt.run_stats import REPLAYED
    with run_stats.collect() as stats:
        call()
    assert stats.replay.kind == REPLAYED, stats.replay
    return int(re.search(r"replay of (\d+) torch calls", stats.replay.reason).group(1))


def test_the_append_is_as_lean_as_the_write_and_the_write_pays_only_its_skip():
    """Like for like: the append is the write's unordered row mscatter (12 replayed calls; 25 with
    scatter_update's bounds check and last-write-wins sort), and the write pays over it only the -1 skip: each -1
    row redirected to the live row of the smallest slot (lt, min, two where) and, per cache, the rows gathered
    before the copy (15 calls; a spare row found, read and put back made 18)."""
    import torch
    from pypto_rt import config
    from pypto_rt.replay.policy import ReplayPolicy, policy_scope
    pool = paged_kv._Pool(32, 16, torch.float32)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        fns = paged_kv._write(pool, padded=True)
        for _ in range(ReplayPolicy().normal_runs + 2 * ReplayPolicy().trial_replays + 2):
            fns["paged_kernel"](), fns["append_kernel"]()
        paged, append = _replayed_calls(fns["paged_kernel"]), _replayed_calls(fns["append_kernel"])
    assert append <= 12 and paged <= append + 3, (paged, append)


def test_append_kv_checks_its_positions_and_arguments_like_write_kv_cache():
    import pytest
    import torch
    from pypto_rt import config
    from pypto_rt.kernels.attention import AttentionArgumentError
    from bench.contiguous_kv import append_kv
    gen = torch.Generator().manual_seed(3)
    key, value = (torch.randn(3, 2, 8, generator=gen) for _ in range(2))
    kc, vc = torch.zeros(3, 64, 2, 8), torch.zeros(3, 64, 2, 8)
    with config.scope(EXECUTOR="compiled"):
        append_kv(key, value, kc, vc, torch.tensor([0, 63, 5], dtype=torch.int32))
        for bad in (64, -1):
            with pytest.raises(AttentionArgumentError, match=rf"positions holds {bad}, outside the cache's 64 rows"):
                append_kv(key, value, kc, vc, torch.tensor([1, bad, 2], dtype=torch.int32))
        with pytest.raises(AttentionArgumentError, match="positions is"):
            append_kv(key, value, kc, vc, torch.tensor([1, 2, 3]))
    assert torch.equal(kc[[0, 1, 2], [0, 63, 5]], key) and torch.equal(vc[[0, 1, 2], [0, 63, 5]], value)
    assert int((kc != 0).flatten(2).any(2).sum()) == 3


def test_the_cpu_time_write_table_runs_at_a_small_context():
    from pypto_rt.replay.policy import policy_scope
    with policy_scope(slower=float("inf"), parallel=float("inf")):
        body = paged_kv.cpu_write(repeats=1, calls=2, contexts=(32,), blocks=(16,))
    assert "kernel / append kernel" in body and body.count("| 32 | 16 |") == 2
