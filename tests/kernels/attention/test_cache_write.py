"""The cache write against its golden on both executors: -1 slots write nothing (the last slot survives a -1,
pitfall 1), no slot outside the mapping changes, both pool forms, bf16 and fp32, and argument errors."""
import pytest
import torch

from pypto_rt import config
from pypto_rt.kernels.attention import AttentionArgumentError, write_kv_cache
from pypto_rt.kernels.attention import golden

NB, BS, KVH, D = 6, 4, 2, 8


@pytest.fixture(params=["reference", "compiled"], autouse=True)
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


def caches(dtype=torch.float32, blocks=NB, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(blocks, BS, KVH, D, generator=gen).to(dtype) for _ in range(2))


def rows(n, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, KVH, D, generator=gen).to(dtype) for _ in range(2))


def check_write(slots, dtype=torch.float32, key_cache=None, value_cache=None):
    key, value = rows(len(slots), dtype)
    kc, vc = caches(dtype) if key_cache is None else (key_cache, value_cache)
    want_k, want_v = kc.clone(), vc.clone()
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    golden.write_kv_cache(key, value, want_k, want_v, slot_mapping)
    assert write_kv_cache(key, value, kc, vc, slot_mapping) is None
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    return kc, vc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slots_are_written_and_nothing_else_changes(dtype):
    slots = [0, 5, BS * NB - 1, 9, 13]
    kc, vc = caches(dtype)
    before = kc.clone()
    check_write(slots, dtype, kc, vc)
    changed = (kc != before).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
    assert changed == sorted(slots)


def test_minus_one_slots_write_nothing_and_the_last_slot_survives():
    kc, vc = caches()
    last_k, last_v = kc[-1, -1].clone(), vc[-1, -1].clone()
    check_write([-1, 3, -1, 7, -1], key_cache=kc, value_cache=vc)
    assert torch.equal(kc[-1, -1], last_k) and torch.equal(vc[-1, -1], last_v)


@pytest.mark.parametrize("slots", [[-1, 3, -1, 3, -1], [9, -1, 9, 2, -1]])
def test_a_slot_written_twice_holds_one_of_its_rows_and_nothing_else_changes(slots):
    """Live slots of one call must be distinct (as vLLM's); a repeated one holds one of its rows, unspecified which
    (docs/semantics_decisions.md), and every other slot is as the rows without the repeat leave it."""
    key, value = rows(len(slots))
    kc, vc = caches()
    want_k, want_v = kc.clone(), vc.clone()
    slot_mapping = torch.tensor(slots)
    golden.write_kv_cache(key, value, want_k, want_v, slot_mapping)
    write_kv_cache(key, value, kc, vc, slot_mapping)
    twice = max((s for s in slots if s >= 0), key=slots.count)
    at = (twice // BS, twice % BS)
    writers = [i for i, s in enumerate(slots) if s == twice]
    assert any(torch.equal(kc[at], key[i]) and torch.equal(vc[at], value[i]) for i in writers)
    kc[at], vc[at] = want_k[at], want_v[at]
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_a_slot_outside_the_pool_is_named_and_nothing_is_written():
    key, value = rows(3)
    kc, vc = caches()
    before = kc.clone()
    for bad in (NB * BS, -2 ** 40):
        with pytest.raises(AttentionArgumentError, match=rf"slot_mapping holds slot {bad}, outside the pool's "
                                                         rf"{NB * BS} slots .*or -1 for padding"):
            write_kv_cache(key, value, kc, vc, torch.tensor([1, bad, 2]))
    assert torch.equal(kc, before)


def test_all_padding_slots_leave_the_caches_unchanged():
    kc, vc = caches()
    before_k, before_v = kc.clone(), vc.clone()
    check_write([-1] * 5, key_cache=kc, value_cache=vc)
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def test_a_quarter_padding_with_int32_slots():
    key, value = rows(8)
    kc, vc = caches()
    slots = torch.tensor([4, -1, 5, 6, -1, 20, 21, 2], dtype=torch.int32)
    want_k, want_v = kc.clone(), vc.clone()
    golden.write_kv_cache(key, value, want_k, want_v, slots)
    write_kv_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_a_stacked_pool_takes_a_layer_slice_or_offset_block_ids():
    layers = 3
    pool_k, pool_v = caches(blocks=layers * NB)
    sliced_k, sliced_v = pool_k.clone(), pool_v.clone()
    check_write([1, -1, 6], key_cache=sliced_k[NB:2 * NB], value_cache=sliced_v[NB:2 * NB])
    offset = [s + NB * BS if s >= 0 else -1 for s in (1, -1, 6)]
    check_write(offset, key_cache=pool_k, value_cache=pool_v)
    assert torch.equal(pool_k, sliced_k) and torch.equal(pool_v, sliced_v)


def test_padding_next_to_the_low_slots_leaves_the_spare_slot_as_it_was():
    check_write([0, 1, -1, 4, 2])          # the -1 row rewrites slot 3, the first slot no live row names


def test_a_pool_no_larger_than_the_rows_written_still_skips_padding():
    kc, vc = caches(blocks=1)                      # 4 slots, all written, and a padding row: no spare slot
    check_write([2, -1, 0, 3, 1], key_cache=kc, value_cache=vc)
    check_write([-1] * 5, key_cache=kc, value_cache=vc)


def test_empty_writes_are_legal():
    kc, vc = caches()
    before = kc.clone()
    write_kv_cache(*rows(0), kc, vc, torch.zeros(0, dtype=torch.int64))
    assert torch.equal(kc, before)


def test_a_cache_of_another_dtype_is_named():
    key, value = rows(2)
    kc, vc = caches(torch.bfloat16)
    with pytest.raises(AttentionArgumentError, match=r"key_cache is torch.bfloat16 .*dtype of the keys"):
        write_kv_cache(key, value, kc, vc, torch.tensor([0, 1]))
