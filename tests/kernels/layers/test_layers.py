"""The layer kernels against their torch goldens on the compiled runtime (fp32 and bf16, a partial last row block,
T = 0), greedy's ties, argument errors at the caller's line, and replay of repeated calls of one shape."""
import pytest
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.layers import (LayerArgumentError, embedding, greedy, linear, rms_norm, rope_cache,
                                     rotary_embedding)
from pypto_rt.kernels.layers.common import ROW_TILE
from pypto_rt.kernels.layers.golden import (embedding_golden, greedy_golden, linear_golden, rms_norm_golden,
                                            rotary_golden)
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

H, V, D = 32, 50, 16
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
TOKENS = pytest.mark.parametrize("tokens", [ROW_TILE + 6, 1, 0])


def _randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


@DTYPES
@TOKENS
def test_embedding_gathers_the_rows_of_the_ids(dtype, tokens):
    gen = torch.Generator().manual_seed(1)
    table, ids = _randn(gen, V, H, dtype=dtype), torch.randint(0, V, (tokens,), generator=gen)
    assert torch.equal(embedding(ids, table), embedding_golden(ids, table))


@DTYPES
@TOKENS
def test_rms_norm_and_its_fused_residual_add(dtype, tokens):
    gen = torch.Generator().manual_seed(2)
    x, weight, residual = _randn(gen, tokens, H, dtype=dtype), _randn(gen, H, dtype=dtype), _randn(gen, tokens, H,
                                                                                                     dtype=dtype)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), rms_norm_golden(x, weight, 1e-5), rtol=1e-6, atol=1e-6)
    updated = residual.clone()
    out = rms_norm(x, weight, 1e-5, residual=updated)
    want, want_residual = rms_norm_golden(x, weight, 1e-5, residual=residual)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(updated, want_residual)


@DTYPES
@TOKENS
def test_rotary_embedding_is_neox_style_at_the_given_positions(dtype, tokens):
    gen = torch.Generator().manual_seed(3)
    cos_sin = rope_cache(D, 256, theta=1e4)
    positions = torch.randint(0, 256, (tokens,), generator=gen)
    x = _randn(gen, tokens, 3, D, dtype=dtype)
    out = rotary_embedding(x, positions, cos_sin)
    assert out.shape == x.shape
    torch.testing.assert_close(out, rotary_golden(x, positions, cos_sin), rtol=1e-6, atol=1e-6)
    if tokens:
        assert torch.equal(rotary_embedding(x[:1], torch.zeros(1, dtype=torch.int64), cos_sin), x[:1])  # angle 0


@DTYPES
@TOKENS
@pytest.mark.parametrize("n_out, k_in", [(48, 32), (2 * 1024 + 64, 1024 + 16)], ids=["small", "blocked"])
def test_linear_accumulates_in_fp32_and_rounds_once(dtype, tokens, n_out, k_in):
    gen = torch.Generator().manual_seed(4)
    x, weight = _randn(gen, tokens, k_in, dtype=dtype), _randn(gen, n_out, k_in, dtype=dtype) / k_in ** 0.5
    ulp = 1e-5 if dtype == torch.float32 else 2 ** -7      # a different FP32 summation order may round 1 ulp apart
    torch.testing.assert_close(linear(x, weight), linear_golden(x, weight), rtol=ulp, atol=ulp)
    logits = linear(x, weight, out_dtype=torch.float32)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, linear_golden(x, weight, torch.float32), rtol=1e-5, atol=1e-5)


@DTYPES
@TOKENS
def test_greedy_picks_the_lowest_id_among_equal_maxima(dtype, tokens):
    gen = torch.Generator().manual_seed(5)
    logits = _randn(gen, tokens, V, dtype=dtype)
    if tokens:
        logits[0, [9, 3, 40]] = 100.0
    got = greedy(logits)
    assert got.dtype == torch.int64 and torch.equal(got, greedy_golden(logits))
    if tokens:
        assert int(got[0]) == 3


def test_a_bad_argument_names_the_layer_and_the_callers_line():
    with pytest.raises(LayerArgumentError) as caught:
        linear(torch.zeros(2, 8), torch.zeros(4, 6))
    assert "linear: weight must be torch.float32 [N, 8]" in caught.value.message
    assert caught.value.span.file == __file__


def test_repeated_decode_steps_of_one_shape_replay():
    gen = torch.Generator().manual_seed(6)
    table, weight, w_out = _randn(gen, V, H), _randn(gen, H), _randn(gen, V, H)
    cos_sin = rope_cache(D, 64)
    calls = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(calls):
            ids, positions = torch.randint(0, V, (4,), generator=gen), torch.randint(0, 64, (4,), generator=gen)
            with run_stats.collect() as stats:
                x = embedding(ids, table)
                h = rotary_embedding(rms_norm(x, weight), positions, cos_sin[:, :D])
                tokens = greedy(linear(h, w_out, out_dtype=torch.float32))
            assert torch.equal(tokens, greedy_golden(linear_golden(
                rotary_golden(rms_norm_golden(embedding_golden(ids, table), weight), positions, cos_sin), w_out,
                torch.float32)))
    assert stats.replay.kind == REPLAYED, stats.replay


def test_the_reference_executor_computes_the_same():
    """The layer kernels mean the same on the reference executor (the semantic oracle) as on the compiled one."""
    gen = torch.Generator().manual_seed(7)
    tokens = ROW_TILE + 3
    table, weight, w_out = _randn(gen, V, H), _randn(gen, H), _randn(gen, V, H)
    ids, positions = torch.randint(0, V, (tokens,), generator=gen), torch.randint(0, 64, (tokens,), generator=gen)
    cos_sin, residual = rope_cache(D, 64), _randn(gen, tokens, H)

    def step():
        x = embedding(ids, table)
        h = rotary_embedding(rms_norm(x, weight, residual=residual.clone()), positions, cos_sin)
        return linear(h, w_out, out_dtype=torch.float32), greedy(linear(h, w_out))

    with config.scope(EXECUTOR="reference"):
        reference = step()
    with config.scope(EXECUTOR="compiled"):
        compiled = step()
    assert torch.equal(reference[0], compiled[0]) and torch.equal(reference[1], compiled[1])
