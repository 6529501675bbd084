"""A serving loop's calls replay: the same shapes with changing lengths, slot mappings and block tables are
recorded once and replayed as torch calls (the lengths, slots and table entries read again by every replay),
with every call's results equal to the golden's (a prefill's too while its chunks keep their number of query
tiles)."""
import re

import pytest
import torch

import pypto.language as pl

from pypto_rt import config, run_stats
from pypto_rt.kernels.attention import (cache_write, chunked_prefill_attention, golden, paged,
                                        paged_decode_attention, write_kv_cache)
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

B, NB, BS, MB, KVH, QH, D = 3, 24, 4, 6, 2, 4, 8
CALLS = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2


@pytest.fixture(autouse=True)
def fresh_kernels():
    """Kernels built afresh: specialisations other tests of the process recorded (their shapes) do not count
    against this test's (policy.max_specialisations per entry)."""
    for builder in (cache_write.cache_write_kernel, paged.decode_kernel, paged.prefill_kernel):
        builder.cache_clear()


def test_decode_steps_with_changing_lengths_slots_and_tables_replay():
    gen = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=gen), torch.randn(NB, BS, KVH, D, generator=gen)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for step in range(CALLS):
            tables = torch.randperm(NB, generator=gen)[: B * MB].int().view(B, MB)
            lens = torch.tensor([1 + step, 0, MB * BS - step], dtype=torch.int32)
            slots = torch.tensor([int(tables[b, (n - 1) // BS]) * BS + (n - 1) % BS if n else -1
                                  for b, n in enumerate(lens.tolist())])
            key, value, q = (torch.randn(B, h, D, generator=gen) for h in (KVH, KVH, QH))
            want_k, want_v = kc.clone(), vc.clone()
            golden.write_kv_cache(key, value, want_k, want_v, slots)
            with run_stats.collect() as wrote:
                write_kv_cache(key, value, kc, vc, slots)
            assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
            with run_stats.collect() as attended:
                out = paged_decode_attention(q, kc, vc, tables, lens)
            torch.testing.assert_close(out, golden.paged_decode_attention(q, kc, vc, tables, lens))
    assert wrote.replay.kind == REPLAYED, wrote.replay
    assert attended.replay.kind == REPLAYED, attended.replay


@pytest.mark.parametrize("max_seq_len", [None, MB * BS])
def test_decode_steps_replay_whichever_request_is_the_longest(max_seq_len):
    """The longest request changes every step (lengths rotate over the rows, one row padded): the replay holds,
    since its guards check each length against the tile (with or without the host's bound), not which is longest."""
    gen = torch.Generator().manual_seed(3)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=gen), torch.randn(NB, BS, KVH, D, generator=gen)
    tables = torch.randperm(NB, generator=gen)[: B * MB].int().view(B, MB)
    kinds = []
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for step in range(CALLS + 2):
            lens = torch.tensor([MB * BS - step % 5, 0, 3 + step % 7], dtype=torch.int32).roll(step % B)
            q = torch.randn(B, QH, D, generator=gen)
            with run_stats.collect() as stats:
                out = paged_decode_attention(q, kc, vc, tables, lens, max_seq_len=max_seq_len)
            torch.testing.assert_close(out, golden.paged_decode_attention(q, kc, vc, tables, lens))
            kinds.append(stats.replay.kind)
    assert kinds[-4:] == [REPLAYED] * 4, kinds
    assert _replayed_calls(stats) <= 44, stats.replay.reason        # 63 before the tile was built from constants


def test_a_bf16_decode_rounds_each_cast_in_one_conversion():
    """bf16 probabilities (for the values' matmul) and output are rounded to nearest even, one torch conversion
    each (the default mode, half away from zero, takes ~50 replayed calls a cast: 148 calls in all, now 54: 50, and
    the K and V row gathers' two word views each, ops.mgather)."""
    gen = torch.Generator().manual_seed(5)
    kc, vc = (torch.randn(NB, BS, KVH, D, generator=gen).bfloat16() for _ in range(2))
    tables = torch.randperm(NB, generator=gen)[: B * MB].int().view(B, MB)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for step in range(CALLS):
            lens = torch.tensor([1 + step, 0, MB * BS - step], dtype=torch.int32)
            q = torch.randn(B, QH, D, generator=gen).bfloat16()
            with run_stats.collect() as stats:
                out = paged_decode_attention(q, kc, vc, tables, lens)
            torch.testing.assert_close(out.float(), golden.paged_decode_attention(q, kc, vc, tables, lens).float(),
                                       rtol=2e-2, atol=2e-2)
    assert stats.replay.kind == REPLAYED, stats.replay
    assert _replayed_calls(stats) <= 54, stats.replay.reason


def test_prefill_chunks_of_changing_lengths_over_growing_contexts_replay():
    gen = torch.Generator().manual_seed(1)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=gen), torch.randn(NB, BS, KVH, D, generator=gen)
    tables = torch.randperm(NB, generator=gen)[: B * MB].int().view(B, MB)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for step in range(CALLS):
            chunks = [3, 2 + step % 2, 3 - step % 2]
            lens = torch.tensor([c + s for c, s in zip(chunks, (step, 5 + step, 0))], dtype=torch.int32)
            qsl = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
            q = torch.randn(8, QH, D, generator=gen)
            with run_stats.collect() as stats:
                out = chunked_prefill_attention(q, kc, vc, tables, lens, qsl)
            torch.testing.assert_close(out, golden.chunked_prefill_attention(q, kc, vc, tables, lens, qsl))
    assert stats.replay.kind == REPLAYED, stats.replay


def test_a_bf16_prefill_rounds_each_cast_in_one_conversion():
    """A bf16 prefill replays about the FP32 one's torch calls plus a few conversions per request (one per cast,
    rounding to nearest even, and the 2-byte row gathers' word views, ops.mgather: 338 against 296 here; the default
    mode's emulation made it 608)."""
    calls = {}
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(6)
        kc, vc = (torch.randn(NB, BS, KVH, D, generator=gen).to(dtype) for _ in range(2))
        tables = torch.randperm(NB, generator=gen)[: B * MB].int().view(B, MB)
        qsl = torch.tensor([0, 3, 5, 8], dtype=torch.int32)
        with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
            for step in range(CALLS):
                lens = torch.tensor([3 + step, 7 + step, 3], dtype=torch.int32)
                q = torch.randn(8, QH, D, generator=gen).to(dtype)
                with run_stats.collect() as stats:
                    out = chunked_prefill_attention(q, kc, vc, tables, lens, qsl)
                torch.testing.assert_close(out.float(), golden.chunked_prefill_attention(q, kc, vc, tables, lens,
                                                                                         qsl).float(),
                                           rtol=2e-2, atol=2e-2)
        assert stats.replay.kind == REPLAYED, stats.replay
        calls[dtype] = _replayed_calls(stats)
    assert calls[torch.bfloat16] <= calls[torch.float32] + 14 * B, calls


def _write_steps(kc, vc, gen, slot_steps, call=write_kv_cache):
    """Each step's write (fresh rows) checked against the golden; its replay decision (None: no kernel ran)."""
    kinds = []
    for slots in slot_steps:
        key, value = (torch.randn(len(slots), KVH, D, generator=gen) for _ in range(2))
        want_k, want_v = kc.clone(), vc.clone()
        golden.write_kv_cache(key, value, want_k, want_v, slots)
        with run_stats.collect() as stats:
            call(key, value, kc, vc, slots)
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v), slots
        kinds.append(stats.replay and stats.replay.kind)
    return kinds


def _fresh_slots(gen, steps: int, padding) -> list:
    """`steps` slot mappings of B distinct slots, where padding(step, slots) sets some to -1."""
    out = []
    for step in range(steps):
        slots = torch.randperm(NB * BS, generator=gen)[:B]
        padding(step, slots)
        out.append(slots)
    return out


def test_cache_writes_with_changing_slots_replay_every_call_after_the_trial_even_with_no_live_row():
    """Once kept, the write is replayed at every call, whatever its slots: fresh distinct slots with some -1
    (`write_kv_cache`, whose host check knows a slot is live, and the kernel built without that knowledge), and
    that kernel with all -1 (a step with no live row writes nothing); `write_kv_cache` makes no kernel call then."""
    gen = torch.Generator().manual_seed(2)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=gen), torch.randn(NB, BS, KVH, D, generator=gen)
    kernel = cache_write.cache_write_kernel(BS, KVH, D, pl.FP32, pl.INT64, padded=True)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for call in (write_kv_cache, kernel):
            steps = _fresh_slots(gen, CALLS + 2, lambda step, s: s.__setitem__(step % B, -1))
            kinds = _write_steps(kc, vc, gen, steps, call)
            assert kinds[-4:] == [REPLAYED] * 4, kinds
        assert _write_steps(kc, vc, gen, [torch.full((B,), -1)], kernel) == [REPLAYED]
        assert _write_steps(kc, vc, gen, [torch.full((B,), -1)]) == [None]


def test_a_kernel_promised_a_live_slot_raises_on_all_padding_and_writes_nothing():
    """A kernel built with some_live (write_kv_cache's, after its host check) given no live slot raises before it
    writes anything: a clear error on the engine, torch's index error in a replay."""
    gen = torch.Generator().manual_seed(5)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=gen), torch.randn(NB, BS, KVH, D, generator=gen)
    kernel = cache_write.cache_write_kernel(BS, KVH, D, pl.FP32, pl.INT64, padded=True, some_live=True)
    dead = torch.full((B,), -1)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        before_k, before_v = kc.clone(), vc.clone()
        with pytest.raises(Exception, match="some_kept=True, but every index is skipped"):
            _write_steps(kc, vc, gen, [dead], kernel)
        assert torch.equal(kc, before_k) and torch.equal(vc, before_v)
        steps = _fresh_slots(gen, CALLS, lambda step, s: s.__setitem__(step % B, -1))
        assert _write_steps(kc, vc, gen, steps, kernel)[-2:] == [REPLAYED] * 2
        before_k, before_v = kc.clone(), vc.clone()
        with pytest.raises(IndexError, match="out of bounds"):
            _write_steps(kc, vc, gen, [dead], kernel)
        assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def _replayed_calls(stats) -> int:
    return int(re.search(r"replay of (\d+) torch calls", stats.replay.reason).group(1))


def test_a_write_with_no_padding_replays_a_kernel_that_skips_nothing():
    """The host's slot check tells whether a call has padding and that a slot is live: a call without padding runs
    a kernel that skips nothing (10 replayed calls), one with padding a kernel whose -1 rows rewrite a live row with
    its own data (15: no spare row to find, read and put back, which made 18), and both replay."""
    gen = torch.Generator().manual_seed(4)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=gen), torch.randn(NB, BS, KVH, D, generator=gen)
    calls = {}
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for padded in (False, True):
            steps = _fresh_slots(gen, CALLS + 1, lambda step, s: padded and s.__setitem__(step % B, -1))
            assert _write_steps(kc, vc, gen, steps)[-3:] == [REPLAYED] * 3
            key, value = torch.randn(B, KVH, D, generator=gen), torch.randn(B, KVH, D, generator=gen)
            with run_stats.collect() as stats:
                write_kv_cache(key, value, kc, vc, steps[-1])
            calls[padded] = _replayed_calls(stats)
    assert calls[False] <= 10 and calls[True] <= 15, calls
