"""A paged-attention kernel written the way the kernel library writes them (the issue's held-out check): decode
with an in-kernel append into `pl.InOut` caches, block ids and lengths read with pl.read, a dynamic loop over a
request's blocks, a valid shape on the last block. Block-boundary lengths and padded requests (length 0: no
append, a KV loop of zero trips) on both executors, against the goldens; slots no request wrote hold NaN."""
import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.kernels.attention import golden

B, BS, MAX_BLOCKS, KVH, G, D = 5, 4, 3, 2, 2, 8
QH, NUM_BLOCKS = KVH * G, B * MAX_BLOCKS + 1
ROWS = NUM_BLOCKS * BS
SCALE = D ** -0.5


@pytest.fixture(params=["reference", "compiled"], autouse=True)
def executor(request):
    with config.scope(EXECUTOR=request.param):
        yield request.param


@pl.jit
def decode_append_attention(
    q: pl.Tensor[[B, QH * D], pl.FP32],
    k_new: pl.Tensor[[B, KVH * D], pl.FP32],
    v_new: pl.Tensor[[B, KVH * D], pl.FP32],
    k_cache: pl.InOut[pl.Tensor[[ROWS, KVH * D], pl.FP32]],
    v_cache: pl.InOut[pl.Tensor[[ROWS, KVH * D], pl.FP32]],
    block_table: pl.Tensor[[B * MAX_BLOCKS], pl.INT32],
    seq_lens: pl.Tensor[[B], pl.INT32],
    out: pl.Out[pl.Tensor[[B, QH * D], pl.FP32]],
):
    for b in pl.range(B):
        ctx_len = pl.read(seq_lens, [b])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="kv_append"):
            if ctx_len > 0:
                pos = ctx_len - 1
                blk = pl.cast(pl.read(block_table, [b * MAX_BLOCKS + pos // BS]), pl.INDEX)
                slot = blk * BS + pos % BS
                k_cache[slot : slot + 1, :] = k_new[b : b + 1, :]
                v_cache[slot : slot + 1, :] = v_new[b : b + 1, :]
        for h in pl.range(KVH):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="paged_attention"):
                q_h = pl.reshape(q[b : b + 1, h * G * D : (h + 1) * G * D], [G, D])
                mi0 = pl.full([G, 1], dtype=pl.FP32, value=-1.0e30)
                li0 = pl.full([G, 1], dtype=pl.FP32, value=0.0)
                oi0 = pl.full([G, D], dtype=pl.FP32, value=0.0)
                for sb, (mi, li, oi) in pl.range((ctx_len + BS - 1) // BS, init_values=(mi0, li0, oi0)):
                    blk = pl.cast(pl.read(block_table, [b * MAX_BLOCKS + sb]), pl.INDEX)
                    valid = pl.min(BS, ctx_len - sb * BS)
                    k_tile = pl.slice(k_cache, [BS, D], [blk * BS, h * D], valid_shape=[valid, D])
                    v_tile = pl.fillpad(pl.slice(v_cache, [BS, D], [blk * BS, h * D], valid_shape=[valid, D]))
                    scores = pl.muls(pl.matmul(q_h, k_tile, b_trans=True), SCALE)
                    scores = pl.fillpad(pl.set_validshape(scores, G, valid), pad_value=pl.PadValue.min)
                    mi_new = pl.maximum(mi, pl.row_max(scores))
                    p = pl.exp(pl.row_expand_sub(scores, mi_new))
                    li_new = pl.add(pl.mul(pl.exp(pl.sub(mi, mi_new)), li), pl.row_sum(p))
                    oi_new = pl.add(pl.row_expand_mul(oi, pl.exp(pl.sub(mi, mi_new))), pl.matmul(p, v_tile))
                    mi_out, li_out, oi_out = pl.yield_(mi_new, li_new, oi_new)
                ctx = pl.row_expand_div(oi_out, pl.maxs(li_out, 1.0e-30))
                out[b : b + 1, h * G * D : (h + 1) * G * D] = pl.reshape(ctx, [1, G * D])
    return out


def _case(lengths, seed=0):
    """Caches (NaN except each request's first length - 1 positions), tables, new rows and queries."""
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.full((NUM_BLOCKS, BS, KVH, D), float("nan"))
    v_cache = k_cache.clone()
    tables = (torch.randperm(NUM_BLOCKS - 1, generator=gen)[: B * MAX_BLOCKS] + 1).int().view(B, MAX_BLOCKS)
    for b, length in enumerate(lengths):
        for p in range(max(length - 1, 0)):
            k_cache[tables[b, p // BS], p % BS] = torch.randn(KVH, D, generator=gen)
            v_cache[tables[b, p // BS], p % BS] = torch.randn(KVH, D, generator=gen)
    k_new, v_new, q = (torch.randn(B, heads, D, generator=gen) for heads in (KVH, KVH, QH))
    return k_cache, v_cache, tables, k_new, v_new, q


def _slots(lengths, tables):
    return torch.tensor([int(tables[b, (n - 1) // BS]) * BS + (n - 1) % BS if n else -1
                         for b, n in enumerate(lengths)])


@pytest.mark.parametrize("lengths", [[1, BS, BS + 1, 0, MAX_BLOCKS * BS], [0] * B])
def test_decode_with_an_in_kernel_append_at_block_boundaries(lengths):
    k_cache, v_cache, tables, k_new, v_new, q = _case(lengths)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    golden.write_kv_cache(k_new, v_new, want_k, want_v, _slots(lengths, tables))
    want = golden.paged_decode_attention(q, want_k, want_v, tables, seq_lens)
    out = torch.full((B, QH * D), float("nan"))
    decode_append_attention(q.view(B, -1), k_new.view(B, -1), v_new.view(B, -1), k_cache.view(ROWS, -1),
                            v_cache.view(ROWS, -1), tables.view(-1), seq_lens, out)
    torch.testing.assert_close(out.view(B, QH, D), want)
    torch.testing.assert_close(k_cache, want_k, equal_nan=True)
    torch.testing.assert_close(v_cache, want_v, equal_nan=True)
