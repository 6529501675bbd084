"""The fused layer kernels give, bit for bit, what the kernels they fuse give one after another (reference and
compiled executors, fp32 and bf16, a partial second row block, T = 0): [embedding or residual add, RMSNorm, QKV,
RoPE], [O proj, residual add, RMSNorm], [final residual add, RMSNorm, LM head, greedy]."""
import pytest
import torch

from pypto_rt import config
from pypto_rt.kernels.layers import (LayerArgumentError, embedding, greedy, linear, rms_norm, rope_cache,
                                     rotary_embedding)
from pypto_rt.kernels.layers.attention_input import embed_norm_qkv_rope, norm_qkv_rope
from pypto_rt.kernels.layers.common import ROW_TILE
from pypto_rt.kernels.layers.lm_head import norm_head_greedy
from pypto_rt.kernels.layers.out_norm import out_proj_add_norm

H, QH, KVH, D, V, EPS = 32, 4, 2, 8, 40, 1e-6
EXECUTORS = pytest.mark.parametrize("executor", ["reference", "compiled"])
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
TOKENS = pytest.mark.parametrize("tokens", [ROW_TILE + 3, 1, 0])


def _randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _weights(gen, dtype):
    return (1 + _randn(gen, H, scale=0.1)).to(dtype), _randn(gen, (QH + 2 * KVH) * D, H, dtype=dtype, scale=0.2)


def _separately(normed, w_qkv, positions, cos_sin):
    qkv = linear(normed, w_qkv)
    rotated = rotary_embedding(qkv[:, :(QH + KVH) * D], positions, cos_sin)
    return rotated[:, :QH * D], rotated[:, QH * D:], qkv[:, (QH + KVH) * D:]


@EXECUTORS
@DTYPES
@TOKENS
def test_norm_qkv_rope_equals_the_add_norm_linear_and_rotary_kernels(executor, dtype, tokens):
    gen = torch.Generator().manual_seed(1)
    x, residual = _randn(gen, tokens, H, dtype=dtype), _randn(gen, tokens, H, dtype=dtype)
    norm_w, w_qkv = _weights(gen, dtype)
    positions, cos_sin = torch.randint(0, 30, (tokens,), generator=gen), rope_cache(D, 32)
    with config.scope(EXECUTOR=executor):
        want_residual = residual.clone()
        want = _separately(rms_norm(x, norm_w, EPS, residual=want_residual), w_qkv, positions, cos_sin)
        got = norm_qkv_rope(x, residual, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS)
    assert torch.equal(residual, want_residual)
    for g, w in zip(got, want):
        assert g.is_contiguous() and torch.equal(g, w)


@EXECUTORS
@DTYPES
@TOKENS
def test_embed_norm_qkv_rope_equals_the_embedding_norm_linear_and_rotary_kernels(executor, dtype, tokens):
    gen = torch.Generator().manual_seed(2)
    table, ids = _randn(gen, V, H, dtype=dtype), torch.randint(0, V, (tokens,), generator=gen)
    norm_w, w_qkv = _weights(gen, dtype)
    positions, cos_sin = torch.randint(0, 30, (tokens,), generator=gen), rope_cache(D, 32)
    with config.scope(EXECUTOR=executor):
        rows = embedding(ids, table)
        want = _separately(rms_norm(rows, norm_w, EPS), w_qkv, positions, cos_sin) + (rows,)
        got = embed_norm_qkv_rope(ids, table, norm_w, w_qkv, positions, cos_sin, (QH, KVH), EPS)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@EXECUTORS
@DTYPES
@TOKENS
def test_out_proj_add_norm_equals_the_linear_and_add_norm_kernels(executor, dtype, tokens):
    gen = torch.Generator().manual_seed(3)
    attn, w_o = _randn(gen, tokens, QH * D, dtype=dtype), _randn(gen, H, QH * D, dtype=dtype, scale=0.2)
    residual, norm_w = _randn(gen, tokens, H, dtype=dtype), _weights(gen, dtype)[0]
    with config.scope(EXECUTOR=executor):
        want_residual = residual.clone()
        want = rms_norm(linear(attn, w_o), norm_w, EPS, residual=want_residual)
        got = out_proj_add_norm(attn, w_o, residual, norm_w, EPS)
    assert torch.equal(got, want) and torch.equal(residual, want_residual)


@EXECUTORS
@DTYPES
@pytest.mark.parametrize("last", [[ROW_TILE + 2, 0, 5], [0]], ids=["three", "one"])
def test_norm_head_greedy_equals_the_norm_lm_head_and_greedy_kernels(executor, dtype, last):
    gen = torch.Generator().manual_seed(4)
    tokens = ROW_TILE + 3
    hidden, residual = _randn(gen, tokens, H, dtype=dtype), _randn(gen, tokens, H, dtype=dtype)
    norm_w, lm_head = _weights(gen, dtype)[0], _randn(gen, V, H, dtype=dtype, scale=0.2)
    rows = torch.tensor(last)
    with config.scope(EXECUTOR=executor):
        normed = rms_norm(embedding(rows, hidden), norm_w, EPS, residual=embedding(rows, residual))
        logits = linear(normed, lm_head, out_dtype=torch.float32)
        ids, got = norm_head_greedy(hidden, residual, rows, norm_w, lm_head, EPS)
    assert torch.equal(got, logits) and torch.equal(ids, greedy(logits))


def test_a_mismatched_weight_is_an_error_naming_it_at_the_callers_line():
    gen = torch.Generator().manual_seed(5)
    x = _randn(gen, 2, H)
    norm_w, w_qkv = _weights(gen, torch.float32)
    with pytest.raises(LayerArgumentError, match="w_qkv must be") as info:
        norm_qkv_rope(x, x.clone(), norm_w, w_qkv[1:], torch.zeros(2, dtype=torch.int64), rope_cache(D, 8), (QH, KVH))
    assert "test_fused_layers.py" in str(info.value)


def test_a_call_that_passes_its_checks_builds_no_error_text(monkeypatch):
    """The decode step's hot path: the checks' messages (describe() of each tensor) are made only on failure."""
    from pypto_rt.kernels.layers import attention_input, common, lm_head, out_norm
    described = []

    def counting(value):
        described.append(value)
        return "described"
    for module in (common, attention_input, lm_head, out_norm):
        monkeypatch.setattr(module, "describe", counting)
    gen = torch.Generator().manual_seed(6)
    x, residual, positions = _randn(gen, 2, H), _randn(gen, 2, H), torch.zeros(2, dtype=torch.int64)
    norm_w, w_qkv = _weights(gen, torch.float32)
    with config.scope(EXECUTOR="reference"):
        norm_qkv_rope(x, residual, norm_w, w_qkv, positions, rope_cache(D, 8), (QH, KVH))
        out_proj_add_norm(_randn(gen, 2, QH * D), _randn(gen, H, QH * D), residual, norm_w, EPS)
        norm_head_greedy(x, residual, torch.ones(1, dtype=torch.int64), norm_w, _randn(gen, V, H), EPS)
    assert described == []
    with pytest.raises(LayerArgumentError, match="residual must be a contiguous torch.float32 \\[2, 32\\] \\(x's "
                       "shape\\), got described"):
        norm_qkv_rope(x, residual.double(), norm_w, w_qkv, positions, rope_cache(D, 8), (QH, KVH))
