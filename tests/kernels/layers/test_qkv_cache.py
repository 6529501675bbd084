"""[attention input + cache write] in one kernel (kernels/layers/qkv_cache.py) gives, bit for bit, what
norm_qkv_rope / embed_norm_qkv_rope then write_kv_cache give (reference and compiled executors, fp32 and bf16, a
partial second row block, padded slots), and the LM head's rows form (last=None) what the gather form gives for
last = every row."""
import pytest
import torch

from pypto_rt import config
from pypto_rt.kernels.attention import AttentionArgumentError, write_kv_cache
from pypto_rt.kernels.layers import rope_cache
from pypto_rt.kernels.layers.attention_input import embed_norm_qkv_rope, norm_qkv_rope
from pypto_rt.kernels.layers.common import ROW_TILE
from pypto_rt.kernels.layers.lm_head import norm_head_greedy
from pypto_rt.kernels.layers.qkv_cache import embed_norm_qkv_rope_cache, norm_qkv_rope_cache

H, QH, KVH, D, V, EPS, BLOCK, BLOCKS = 32, 4, 2, 8, 40, 1e-6, 4, 24
EXECUTORS = pytest.mark.parametrize("executor", ["reference", "compiled"])
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
SLOTS = pytest.mark.parametrize("tokens,padded", [(ROW_TILE + 3, False), (1, False), (5, True)])


def _randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _inputs(gen, tokens, dtype, padded):
    norm_w = (1 + _randn(gen, H, scale=0.1)).to(dtype)
    w_qkv = _randn(gen, (QH + 2 * KVH) * D, H, dtype=dtype, scale=0.2)
    positions, cos_sin = torch.randint(0, 30, (tokens,), generator=gen), rope_cache(D, 32)
    slots = torch.randperm(BLOCKS * BLOCK, generator=gen)[:tokens]
    if padded:
        slots[1::2] = -1
    caches = [_randn(gen, BLOCKS, BLOCK, KVH, D, dtype=dtype) for _ in range(2)]
    return norm_w, w_qkv, positions, cos_sin, slots, caches


def _written(k, v, caches, slots):
    want = [c.clone() for c in caches]
    write_kv_cache(k.view(-1, KVH, D), v.view(-1, KVH, D), *want, slots)
    return want


@EXECUTORS
@DTYPES
@SLOTS
def test_norm_qkv_rope_cache_equals_norm_qkv_rope_then_the_cache_write(executor, dtype, tokens, padded):
    gen = torch.Generator().manual_seed(1)
    x, residual = _randn(gen, tokens, H, dtype=dtype), _randn(gen, tokens, H, dtype=dtype)
    norm_w, w_qkv, positions, cos_sin, slots, caches = _inputs(gen, tokens, dtype, padded)
    with config.scope(EXECUTOR=executor):
        want_residual = residual.clone()
        want = norm_qkv_rope(x, want_residual, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS)
        want_caches = _written(want[1], want[2], caches, slots)
        got = norm_qkv_rope_cache(x, residual, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS, *caches, slots,
                                  padded)
    assert torch.equal(residual, want_residual)
    for g, w in zip(list(got) + caches, list(want) + want_caches):
        assert torch.equal(g, w)


@EXECUTORS
@DTYPES
@SLOTS
def test_embed_norm_qkv_rope_cache_equals_embed_norm_qkv_rope_then_the_cache_write(executor, dtype, tokens, padded):
    gen = torch.Generator().manual_seed(2)
    table, ids = _randn(gen, V, H, dtype=dtype), torch.randint(0, V, (tokens,), generator=gen)
    norm_w, w_qkv, positions, cos_sin, slots, caches = _inputs(gen, tokens, dtype, padded)
    with config.scope(EXECUTOR=executor):
        want = embed_norm_qkv_rope(ids, table, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS)
        want_caches = _written(want[1], want[2], caches, slots)
        got = embed_norm_qkv_rope_cache(ids, table, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS, *caches,
                                        slots, padded)
    for g, w in zip(list(got) + caches, list(want) + want_caches):
        assert torch.equal(g, w)


def test_a_cache_of_other_heads_is_an_error_naming_it():
    gen = torch.Generator().manual_seed(3)
    x, residual = _randn(gen, 2, H), _randn(gen, 2, H)
    norm_w, w_qkv, positions, cos_sin, slots, _ = _inputs(gen, 2, torch.float32, False)
    caches = [torch.zeros(BLOCKS, BLOCK, KVH + 1, D) for _ in range(2)]
    with pytest.raises(Exception, match="key_cache must be"):
        norm_qkv_rope_cache(x, residual, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS, *caches, slots, False)
    with pytest.raises(AttentionArgumentError, match="slot_mapping"):
        norm_qkv_rope_cache(x, residual, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS,
                            *[torch.zeros(BLOCKS, BLOCK, KVH, D) for _ in range(2)], slots.int(), False)


@EXECUTORS
@pytest.mark.parametrize("rows", [ROW_TILE + 3, 1])
def test_the_heads_rows_form_equals_the_gather_of_every_row(executor, rows):
    gen = torch.Generator().manual_seed(4)
    hidden, residual = _randn(gen, rows, H), _randn(gen, rows, H)
    norm_w, lm_head = 1 + _randn(gen, H, scale=0.1), _randn(gen, V, H, scale=0.2)
    with config.scope(EXECUTOR=executor):
        want = norm_head_greedy(hidden, residual, torch.arange(rows), norm_w, lm_head, EPS)
        got = norm_head_greedy(hidden, residual, None, norm_w, lm_head, EPS)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
