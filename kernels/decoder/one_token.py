"""One decode token through the whole MoE decoder in L + 1 kernel calls (one rank; every MoE layer in its one-token
hit-experts form, kernels.moe.local_decode_hit):

    layer 0      [embedding, RMSNorm, QKV, RoPE, cache write, paged decode attention, O proj, residual add,
                  RMSNorm, route]                                                           first_layer_kernel
    layer l > 0  [layer l - 1's hit experts, residual add, RMSNorm, QKV, ... route]         next_layer_kernel
    the head     [layer L - 1's hit experts, residual add, final RMSNorm, LM head, greedy]  head_kernel

Each stage is the inline piece its own module's kernel runs (attention_input, qkv_cache, paged, out_norm,
local_decode_hit, lm_head), in the same order with the same roundings, so the results equal the per-stage
kernels' bit for bit. A kernel boundary stays after each route: the hit experts read their expert ids with
pl.read, which a replay reads again only from an input (read from data the same call computed, it would be fixed).

The caller (MoEDecoder) gives what the per-stage entry points check: its own weights, caches it allocated, a
decode batch of one live token whose slot is inside the pool (int64), block_tables [1, max_blocks] INT32 and
seq_lens [1] INT32 within the table's span (a length past it fails the cache gather: the caller names it).
"""
import functools
from dataclasses import dataclass

import pypto.language as pl
from pypto_rt.kernels.attention.paged import AttnShape, decode_batcher, longest_length
from pypto_rt.kernels.layers.attention_input import QkvShape, _project_rotate
from pypto_rt.kernels.layers.common import PL_DTYPES, cast_to, matmul_bt_walked
from pypto_rt.kernels.layers.norm import rms_normalizer
from pypto_rt.kernels.layers.out_norm import out_proj_add_normer
from pypto_rt.kernels.layers.qkv_cache import cache_writer
from pypto_rt.kernels.moe.local_decode import LocalDecodeShape
from pypto_rt.kernels.moe.local_decode_hit import hit_experter, router_and_gate

NB_DYN = pl.dynamic("NB_DYN")


@dataclass(frozen=True)
class OneTokenShape:
    qkv: QkvShape                 # its eps is every RMSNorm's
    attn: AttnShape
    kv_tile: int                  # the decode's KV tile (paged.decode_tile of the step's longest length)
    moe: LocalDecodeShape


def _attention_block(shape: OneTokenShape):
    """The inline `(summed [1, H], weight, w_qkv, pos [1, 1], cos_sin, slots [1, 1], k_flat, v_flat, k_rows,
    v_rows, table [1, max_blocks], seq_lens [1], w_o, post_weight, gate_weight, bias) -> (residual, normed,
    topk_idx, topk_weights)`: from the residual stream's row to the route of the layer's MoE input. The token's
    k / v rows are written into the caches (k_flat / v_flat, [slots, KVH * D] views) before the attention gathers
    from them (k_rows / v_rows, [slots * KVH, D] views of the same caches)."""
    qkv, attn = shape.qkv, shape.attn
    dt, hidden, qh, d = PL_DTYPES[qkv.dtype], qkv.hidden, qkv.q_heads, qkv.head_dim
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, qkv.eps)
    project_rotate, write_cache = _project_rotate(qkv), cache_writer(False)
    longest, decode_batch = longest_length(shape.kv_tile), decode_batcher(attn, shape.kv_tile)
    add_norm = out_proj_add_normer(hidden, qkv.q_width, dt, qkv.eps)
    route = router_and_gate(shape.moe, 1)

    @pl.jit.inline
    def attention_block(summed, weight, w_qkv, pos, cos_sin, slots, k_flat, v_flat, k_rows, v_rows, table,
                        seq_lens, w_o, post_weight, gate_weight, bias):
        normed = narrow(normalize(widen(summed), widen(weight)))
        angles = pl.mgather(cos_sin, pos, coalesce="row")
        q_row, k_row, v_row = project_rotate(normed, w_qkv, angles, 1)
        k_flat, v_flat = write_cache(k_row, v_row, slots, k_flat, v_flat)
        lens = pl.reshape(seq_lens, [1, 1, 1])
        attended = decode_batch(pl.reshape(q_row, [1, qh, d]), lens, longest(seq_lens, 1), table, k_rows, v_rows, 1)
        residual, x = add_norm(pl.reshape(attended, [1, qh * d]), w_o, summed, post_weight)
        topk_idx, topk_weights = route(x, gate_weight, bias)
        return residual, x, topk_idx, topk_weights

    return attention_block


def _cache_viewer(shape: OneTokenShape):
    """The inline `(key_cache, value_cache [NB, bs, KVH, D]) -> (k_flat, v_flat [NB * bs, KVH * D], k_rows, v_rows
    [NB * bs * KVH, D])`: the views the cache write and the attention's gathers take."""
    bs, kvh, d = shape.attn.block_size, shape.qkv.kv_heads, shape.qkv.head_dim
    kw = kvh * d

    @pl.jit.inline
    def cache_views(key_cache, value_cache):
        cache_rows = pl.tensor.dim(key_cache, 0) * bs
        head_rows = pl.tensor.dim(key_cache, 0) * bs * kvh
        k_flat = pl.reshape(key_cache, [cache_rows, kw])
        v_flat = pl.reshape(value_cache, [cache_rows, kw])
        return k_flat, v_flat, pl.reshape(key_cache, [head_rows, d]), pl.reshape(value_cache, [head_rows, d])

    return cache_views


def _moe_residual(shape: OneTokenShape):
    """The inline `(x [1, H], topk_idx, topk_weights, gate_up, down, residual [1, H]) -> [1, H]`: the layer's hit
    experts on its normed input x, plus the residual stream (rounded to the dtype), the next stage's input."""
    dt = PL_DTYPES[shape.qkv.dtype]
    widen, narrow, hit_experts = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), hit_experter(shape.moe)

    @pl.jit.inline
    def moe_residual(x, topk_idx, topk_weights, gate_up, down, residual):
        return narrow(pl.add(widen(hit_experts(x, topk_idx, topk_weights, gate_up, down)), widen(residual)))

    return moe_residual


def _dims(shape: OneTokenShape):
    """(dtype, router dtype, H, QKV width, Q width, KVH, D, cos|sin rows, block size, max blocks, E, K, the fused
    experts' width N)."""
    qkv, attn, moe = shape.qkv, shape.attn, shape.moe
    return (PL_DTYPES[qkv.dtype], PL_DTYPES[moe.router_dtype], qkv.hidden, qkv.q_width + 2 * qkv.kv_width,
            qkv.q_width, qkv.kv_heads, qkv.head_dim, qkv.positions, attn.block_size, attn.max_blocks,
            moe.gate.num_experts, moe.gate.top_k, moe.gate.num_experts * moe.inter + moe.shared_inter)


@functools.lru_cache(maxsize=None)
def first_layer_kernel(shape: OneTokenShape, vocab: int):
    """`(ids [1, 1] INT64, table [V, H], weight [1, H], w_qkv, pos [1, 1] INT64, cos_sin, slot_mapping [1] INT64,
    key_cache, value_cache (in/out), block_tables [1, max_blocks] INT32, seq_lens [1] INT32, w_o, post_weight
    [1, H], gate_weight [E, H], bias [1, E] FP32, residual, normed [1, H] out, topk_idx [1, K] INT32 out,
    topk_weights [1, K] FP32 out)`: layer 0 up to its route; residual is the embedding row plus the attention
    block's output."""
    dt, rdt, hidden, width, qw, kvh, d, positions, bs, mb, experts, top_k, _ = _dims(shape)
    attention_block, cache_views = _attention_block(shape), _cache_viewer(shape)

    @pl.jit
    def one_token_first_layer(
        ids: pl.Tensor[[1, 1], pl.INT64],
        table: pl.Tensor[[vocab, hidden], dt],
        weight: pl.Tensor[[1, hidden], dt],
        w_qkv: pl.Tensor[[width, hidden], dt],
        pos: pl.Tensor[[1, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, d], pl.FP32],
        slot_mapping: pl.Tensor[[1], pl.INT64],
        key_cache: pl.InOut[pl.Tensor[[NB_DYN, bs, kvh, d], dt]],
        value_cache: pl.InOut[pl.Tensor[[NB_DYN, bs, kvh, d], dt]],
        block_tables: pl.Tensor[[1, mb], pl.INT32],
        seq_lens: pl.Tensor[[1], pl.INT32],
        w_o: pl.Tensor[[hidden, qw], dt],
        post_weight: pl.Tensor[[1, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        residual: pl.Out[pl.Tensor[[1, hidden], dt]],
        normed: pl.Out[pl.Tensor[[1, hidden], dt]],
        topk_idx: pl.Out[pl.Tensor[[1, top_k], pl.INT32]],
        topk_weights: pl.Out[pl.Tensor[[1, top_k], pl.FP32]],
    ):
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
        k_flat, v_flat, k_rows, v_rows = cache_views(key_cache, value_cache)
        for _ in pl.spmd(1, name_hint="one_token_first_layer"):
            row = pl.mgather(table, ids, coalesce="row")
            summed, x, chosen, chosen_weights = attention_block(
                row, weight, w_qkv, pos, cos_sin, pl.reshape(slot_mapping, [1, 1]), k_flat, v_flat, k_rows, v_rows,
                block_tables, seq_lens, w_o, post_weight, gate_weight, bias)
            residual[:, :] = summed
            normed[:, :] = x
            topk_idx[:, :] = chosen
            topk_weights[:, :] = chosen_weights
        return residual, normed, topk_idx, topk_weights

    return one_token_first_layer


@functools.lru_cache(maxsize=None)
def next_layer_kernel(shape: OneTokenShape):
    """`(x [1, H], prev_idx [1, K] INT32, prev_weights [1, K] FP32, gate_up, down (the previous layer's MoE),
    residual [1, H] (in/out), weight, w_qkv, pos, cos_sin, slot_mapping, key_cache, value_cache, block_tables,
    seq_lens, w_o, post_weight, gate_weight, bias, normed out, topk_idx out, topk_weights out)`: the previous
    layer's hit experts on its normed input x, then this layer up to its route."""
    dt, rdt, hidden, width, qw, kvh, d, positions, bs, mb, experts, top_k, n = _dims(shape)
    attention_block, moe_residual, cache_views = _attention_block(shape), _moe_residual(shape), _cache_viewer(shape)

    @pl.jit
    def one_token_next_layer(
        x: pl.Tensor[[1, hidden], dt],
        prev_idx: pl.Tensor[[1, top_k], pl.INT32],
        prev_weights: pl.Tensor[[1, top_k], pl.FP32],
        gate_up: pl.Tensor[[hidden, 2 * n], dt],
        down: pl.Tensor[[n, hidden], dt],
        residual: pl.InOut[pl.Tensor[[1, hidden], dt]],
        weight: pl.Tensor[[1, hidden], dt],
        w_qkv: pl.Tensor[[width, hidden], dt],
        pos: pl.Tensor[[1, 1], pl.INT64],
        cos_sin: pl.Tensor[[positions, d], pl.FP32],
        slot_mapping: pl.Tensor[[1], pl.INT64],
        key_cache: pl.InOut[pl.Tensor[[NB_DYN, bs, kvh, d], dt]],
        value_cache: pl.InOut[pl.Tensor[[NB_DYN, bs, kvh, d], dt]],
        block_tables: pl.Tensor[[1, mb], pl.INT32],
        seq_lens: pl.Tensor[[1], pl.INT32],
        w_o: pl.Tensor[[hidden, qw], dt],
        post_weight: pl.Tensor[[1, hidden], dt],
        gate_weight: pl.Tensor[[experts, hidden], rdt],
        bias: pl.Tensor[[1, experts], pl.FP32],
        normed: pl.Out[pl.Tensor[[1, hidden], dt]],
        topk_idx: pl.Out[pl.Tensor[[1, top_k], pl.INT32]],
        topk_weights: pl.Out[pl.Tensor[[1, top_k], pl.FP32]],
    ):
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
        k_flat, v_flat, k_rows, v_rows = cache_views(key_cache, value_cache)
        for _ in pl.spmd(1, name_hint="one_token_next_layer"):
            stream = moe_residual(x, prev_idx, prev_weights, gate_up, down, residual)
            summed, y, chosen, chosen_weights = attention_block(
                stream, weight, w_qkv, pos, cos_sin, pl.reshape(slot_mapping, [1, 1]), k_flat, v_flat, k_rows,
                v_rows, block_tables, seq_lens, w_o, post_weight, gate_weight, bias)
            residual[:, :] = summed
            normed[:, :] = y
            topk_idx[:, :] = chosen
            topk_weights[:, :] = chosen_weights
        return residual, normed, topk_idx, topk_weights

    return one_token_next_layer


@functools.lru_cache(maxsize=None)
def head_kernel(shape: OneTokenShape, vocab: int):
    """`(x [1, H], prev_idx, prev_weights, gate_up, down (the last layer's MoE), residual [1, H], weight [1, H],
    lm_head [V, H], tokens [1, 1] INT64 out, logits [1, V] FP32 out)`: the last layer's hit experts, the residual
    add, the final RMSNorm, the LM head in FP32 and greedy (the lowest id on ties)."""
    dt, _, hidden, _, _, _, _, _, _, _, _, top_k, n = _dims(shape)
    widen, narrow = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt)
    normalize, matmul_bt = rms_normalizer(hidden, shape.qkv.eps), matmul_bt_walked(hidden)
    moe_residual = _moe_residual(shape)

    @pl.jit
    def one_token_head(
        x: pl.Tensor[[1, hidden], dt],
        prev_idx: pl.Tensor[[1, top_k], pl.INT32],
        prev_weights: pl.Tensor[[1, top_k], pl.FP32],
        gate_up: pl.Tensor[[hidden, 2 * n], dt],
        down: pl.Tensor[[n, hidden], dt],
        residual: pl.Tensor[[1, hidden], dt],
        weight: pl.Tensor[[1, hidden], dt],
        lm_head: pl.Tensor[[vocab, hidden], dt],
        tokens: pl.Out[pl.Tensor[[1, 1], pl.INT64]],
        logits: pl.Out[pl.Tensor[[1, vocab], pl.FP32]],
    ):
        for _ in pl.spmd(1, name_hint="one_token_head"):
            stream = moe_residual(x, prev_idx, prev_weights, gate_up, down, residual)
            acc = matmul_bt(narrow(normalize(widen(stream), widen(weight))), lm_head)
            logits[:, :] = acc
            tokens[:, :] = pl.cast(pl.row_argmax(acc), target_type=pl.INT64)
        return tokens, logits

    return one_token_head
