"""Paged decode and chunked-prefill attention against their goldens on both executors: lengths 1, block_size,
block_size + 1 and the maximum (several KV tiles), padded rows with length 0 (zeros, no NaN anywhere, pitfall 3),
blocks shared by several requests, GQA, both pool forms, bf16 and fp32. Slots no request reads hold NaN."""
import pytest
import torch

from pypto_rt import config
from pypto_rt.kernels.attention import (AttentionArgumentError, chunked_prefill_attention,
                                        paged_decode_attention)
from pypto_rt.kernels.attention import golden
from pypto_rt.kernels.attention.paged import KV_TILE, decode_tile

BS, MB, QH, KVH, D = 16, 20, 4, 2, 8
MAX_LEN = BS * MB                                   # 320: two KV tiles
NB = 3 * MB
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
assert MAX_LEN > KV_TILE


@pytest.fixture(params=["reference", "compiled"], autouse=True)
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


def pool(lengths, dtype, blocks=NB, seed=0, shared_first_block=False):
    """(key_cache, value_cache, block_tables): each request's blocks hold data up to its length, every other
    slot NaN; table entries past a request's blocks are 0 (padding, as pypto-serving pads)."""
    gen = torch.Generator().manual_seed(seed)
    kc = torch.full((blocks, BS, KVH, D), float("nan"), dtype=dtype)
    vc = kc.clone()
    tables = torch.zeros(len(lengths), MB, dtype=torch.int32)
    free = torch.randperm(blocks - 1, generator=gen) + 1
    for b, length in enumerate(lengths):
        n = (length + BS - 1) // BS
        tables[b, :n], free = free[:n].int(), free[n:]
        if shared_first_block and b > 0 and n > 0:
            tables[b, 0] = tables[0, 0]
        for i in range(length):
            blk, off = tables[b, i // BS], i % BS
            kc[blk, off] = torch.randn(KVH, D, generator=gen).to(dtype)
            vc[blk, off] = torch.randn(KVH, D, generator=gen).to(dtype)
    if shared_first_block:
        first = max(lengths[0], BS)
        assert all(length >= first for length in lengths[1:])
    return kc, vc, tables


def queries(tokens, dtype, seed=5):
    return torch.randn(tokens, QH, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_at_block_boundaries_and_padded_rows(dtype):
    lengths = [1, BS, BS + 1, MAX_LEN, 0, KV_TILE + 1]
    kc, vc, tables = pool(lengths, dtype)
    tables[4] = -1                                  # a padded row's table may hold anything
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = queries(len(lengths), dtype)
    out = paged_decode_attention(q, kc, vc, tables, seq_lens)
    want = golden.paged_decode_attention(q, kc, vc, tables, seq_lens)
    assert not out.isnan().any()
    assert torch.equal(out[4], torch.zeros_like(out[4]))
    torch.testing.assert_close(out.float(), want.float(), **TOL[dtype])


def test_decode_over_blocks_shared_by_several_requests():
    lengths = [BS, 2 * BS + 3, 3 * BS]
    kc, vc, tables = pool(lengths, torch.float32, shared_first_block=True)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = queries(3, torch.float32)
    out = torch.full_like(q, float("nan"))
    assert paged_decode_attention(q, kc, vc, tables, seq_lens, scale=0.3, out=out) is out
    torch.testing.assert_close(out, golden.paged_decode_attention(q, kc, vc, tables, seq_lens, scale=0.3))


def test_decode_reads_a_stacked_pool_sliced_or_with_offset_block_ids():
    lengths = [5, BS + 1]
    kc, vc, tables = pool(lengths, torch.float32)
    layer = 2
    stack_k = torch.randn(3 * NB, BS, KVH, D)
    stack_v = torch.randn(3 * NB, BS, KVH, D)
    stack_k[layer * NB:(layer + 1) * NB], stack_v[layer * NB:(layer + 1) * NB] = kc, vc
    seq_lens, q = torch.tensor(lengths, dtype=torch.int32), queries(2, torch.float32)
    want = golden.paged_decode_attention(q, kc, vc, tables, seq_lens)
    sliced = paged_decode_attention(q, stack_k[layer * NB:(layer + 1) * NB], stack_v[layer * NB:(layer + 1) * NB],
                                    tables, seq_lens)
    offset = paged_decode_attention(q, stack_k, stack_v, tables + layer * NB, seq_lens)
    torch.testing.assert_close(sliced, want)
    torch.testing.assert_close(offset, want)


def test_the_kv_tile_is_the_smallest_power_of_two_from_the_block_size_that_holds_max_seq_len():
    assert [decode_tile(16, n) for n in (0, 1, 16, 17, 97, 128, 129, 320)] == [16, 16, 16, 32, 128, 128, 256, 256]
    assert decode_tile(16, None) == KV_TILE == 256                  # no bound from the host: the largest tile
    assert decode_tile(128, 5) == 128 and decode_tile(24, 5) == 32 and decode_tile(512, 5) == KV_TILE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_seq_len", [1, BS, BS + 1, 3 * BS + 2, MAX_LEN])
def test_decode_sized_to_max_seq_len_at_block_boundaries_and_padded_rows(max_seq_len, dtype):
    """Each bucket's kernel (16, 32, 64 and the 256-position tile over two tiles): lengths 1, block_size,
    block_size + 1 and the bound itself, a padded row (zeros, no NaN, whatever its table holds)."""
    lengths = sorted({min(n, max_seq_len) for n in (1, BS, BS + 1, max_seq_len)}) + [0]
    kc, vc, tables = pool(lengths, dtype)
    tables[-1] = -1
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = queries(len(lengths), dtype)
    out = paged_decode_attention(q, kc, vc, tables, seq_lens, max_seq_len=max_seq_len)
    assert not out.isnan().any()
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))
    torch.testing.assert_close(out.float(), golden.paged_decode_attention(q, kc, vc, tables, seq_lens).float(),
                               **TOL[dtype])


def test_lengths_past_max_seq_len_are_still_attended_in_full():
    """max_seq_len only sizes the tile: a call whose lengths pass it runs more tiles, and is right."""
    lengths = [BS + 3, MAX_LEN, 2, 0]
    kc, vc, tables = pool(lengths, torch.float32)
    seq_lens, q = torch.tensor(lengths, dtype=torch.int32), queries(4, torch.float32)
    out = paged_decode_attention(q, kc, vc, tables, seq_lens, max_seq_len=BS)
    torch.testing.assert_close(out, golden.paged_decode_attention(q, kc, vc, tables, seq_lens))


@pytest.mark.parametrize("bad", [-1, MAX_LEN + 1, 2.5, True, "97"])
def test_a_max_seq_len_outside_the_block_tables_span_is_named(bad):
    kc, vc, tables = pool([3], torch.float32)
    with pytest.raises(AttentionArgumentError, match=rf"max_seq_len is .* in 0..{MAX_LEN} \(the block table's span"):
        paged_decode_attention(queries(1, torch.float32), kc, vc, tables, torch.tensor([3], dtype=torch.int32),
                               max_seq_len=bad)


@pytest.mark.parametrize("length", [MAX_LEN + 1, KV_TILE * 2 + 5])
def test_a_length_past_the_block_tables_span_is_an_error_not_a_silent_read(length):
    """Positions past max_blocks * block_size have no table entry: the decode raises instead of reading some
    other block (within the table's last tile and in tiles wholly past it)."""
    kc, vc, tables = pool([3, MAX_LEN], torch.float32)
    seq_lens = torch.tensor([3, length], dtype=torch.int32)
    with pytest.raises(AttentionArgumentError, match=rf"seq_lens\[1\] is {length}; it must be at most {MAX_LEN}, "
                       "the block table's span") as caught:
        paged_decode_attention(queries(2, torch.float32), kc, vc, tables, seq_lens)
    assert caught.value.span.file == __file__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_prefill_over_cached_context_plus_the_chunk(dtype):
    lengths = [1, BS, BS + 1, MAX_LEN, 0, 40]
    chunks = [1, 3, BS + 1, 70, 0, 40]              # the last request has no cached context
    kc, vc, tables = pool(lengths, dtype)
    qsl = torch.tensor([0] + torch.tensor(chunks).cumsum(0).tolist(), dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = queries(int(qsl[-1]), dtype)
    out = chunked_prefill_attention(q, kc, vc, tables, seq_lens, qsl)
    want = golden.chunked_prefill_attention(q, kc, vc, tables, seq_lens, qsl)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want.float(), **TOL[dtype])


def test_a_padded_prefill_batch_writes_zeros_past_the_last_request():
    """Tokens past qsl[B] belong to no request: their rows are zeros, whatever out and the cache held (the
    cache's unwritten slots and out are NaN here; a padded request has length 0 and no queries)."""
    lengths = [BS + 2, 0, 3]
    kc, vc, tables = pool(lengths, torch.float32)
    tables[1] = -1
    seq_lens, qsl = torch.tensor(lengths, dtype=torch.int32), torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    q = queries(9, torch.float32)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(q, kc, vc, tables, seq_lens, qsl, out=out)
    want = golden.chunked_prefill_attention(q, kc, vc, tables, seq_lens, qsl)
    assert not out.isnan().any()
    torch.testing.assert_close(out[:5], want[:5])
    assert torch.equal(out[5:], torch.zeros_like(out[5:]))
    no_request = torch.zeros(0, MB, dtype=torch.int32)
    out_all = chunked_prefill_attention(q, kc, vc, no_request, seq_lens[:0], qsl[:1], out=out)
    assert torch.equal(out_all, torch.zeros_like(q))


def test_empty_batches_are_legal():
    kc, vc, _ = pool([], torch.float32)
    q = queries(0, torch.float32)
    tables, lens = torch.zeros(0, MB, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    assert paged_decode_attention(q, kc, vc, tables, lens).shape == (0, QH, D)
    qsl = torch.zeros(1, dtype=torch.int32)
    assert chunked_prefill_attention(q, kc, vc, tables, lens, qsl).shape == (0, QH, D)


def test_heads_that_do_not_group_are_named():
    kc, vc, tables = pool([3], torch.float32)
    q = torch.randn(1, 3, D)
    with pytest.raises(AttentionArgumentError, match=r"key_cache is .*kv_heads dividing the query's 3 heads"):
        paged_decode_attention(q, kc, vc, tables, torch.tensor([3], dtype=torch.int32))
