"""`MoEDecoder`: the small MoE decoder of issue 15 on this rank, built only from pypto-rt kernels, implementing the
serving model protocol (`allocate_kv_cache`, `forward`).

    model = MoEDecoder(cfg, random_state_dict(cfg, seed=0))    # COLLECTIVE in a launched job (MoE windows)
    model.allocate_kv_cache(num_blocks)                        # per-layer pools [num_blocks, block_size, KVH, D]
    next_tokens = model.forward(batch)                         # ForwardBatch -> [B] int64 greedy tokens

A step: embedding -> per layer [RMSNorm (fused residual add) -> QKV GEMM -> neox RoPE -> write_kv_cache ->
paged decode / chunked-prefill attention -> O proj -> RMSNorm (+ residual) -> MoELayer (+ shared expert)] ->
the last token of each request -> final RMSNorm (+ residual) -> LM head (FP32 logits) -> greedy. Stages that run
back to back on the same rows are one kernel each: [embedding or residual add, norm, QKV, RoPE, the cache write],
the attention, [O proj, residual add, norm], the MoE layer (one kernel on one rank at decode size, two for one
token), [final norm, LM head, greedy]: four kernel calls per layer and one more per step. (With another attention
module, or an int32 slot mapping, the cache write is that module's own call.) A decode step of one live token on
one rank runs the whole model in L + 1 kernels instead (one_token_step.py, kernels.decoder), the same bits.

Attention is data-parallel: each rank serves its own requests over its own KV pools. The experts are
expert-parallel: MoELayer's dispatch is collective, so every rank steps together, and a rank with no live
request steps with T = 0 (its attention does nothing, its MoE sends nothing). Padding tokens (slot -1) never
reach MoE: it runs on the live tokens only, so they are neither routed nor counted per expert. Outside a launched
job the model runs in the one process (MoEBuffer's local transport). Every layer's MoE shares one MoEBuffer (their
calls never interleave). The maths is `golden.GoldenDecoder`'s.
"""
from __future__ import annotations

import numpy as np
import torch

from pypto_rt.kernels import attention as attention_kernels
from pypto_rt.kernels.layers import rope_cache
from pypto_rt.kernels.layers.attention_input import embed_norm_qkv_rope, norm_qkv_rope
from pypto_rt.kernels.layers.lm_head import norm_head_greedy
from pypto_rt.kernels.layers.out_norm import out_proj_add_norm
from pypto_rt.kernels.layers.qkv_cache import embed_norm_qkv_rope_cache, norm_qkv_rope_cache
from pypto_rt.kernels.moe import MoEBuffer, MoELayer
from pypto_rt.serving.batch import ForwardBatch
from pypto_rt.serving.model.config import DecoderConfig, layer_prefix
from pypto_rt.serving.model.decoder_errors import DecoderError
from pypto_rt.serving.model.dense_weights import load_dense_weights
from pypto_rt.serving.model.one_token_step import OneTokenStep


class MoEDecoder:
    def __init__(self, cfg: DecoderConfig, state_dict, *, attention=None, one_token_kernels: bool = True):
        """COLLECTIVE in a launched job: every rank builds the model (its MoE buffer allocates windows) and loads
        only its own experts. `attention`: where write_kv_cache, paged_decode_attention and
        chunked_prefill_attention come from (default `pypto_rt.kernels.attention`). `one_token_kernels`: a decode
        step of one token on one rank runs the whole model in L + 1 fused kernels (one_token_step.py) where every MoE
        layer runs its one-token form; False keeps the per-stage kernels (the same results, bit for bit)."""
        if not isinstance(cfg, DecoderConfig):
            raise DecoderError.at_caller(f"MoEDecoder takes a DecoderConfig, got {type(cfg).__name__}")
        self.cfg, self.block_size, self.vocab_size = cfg, cfg.block_size, cfg.vocab_size
        self.attention = attention or attention_kernels
        self.weights = load_dense_weights(cfg, state_dict)
        moe_cfg = cfg.moe_config()
        buffer = MoEBuffer(moe_cfg)
        self.moe = [MoELayer.from_state_dict(moe_cfg, state_dict, prefix=layer_prefix(layer) + "mlp.",
                                             quantize=cfg.quantize, buffer=buffer) for layer in range(cfg.num_layers)]
        self.cos_sin = rope_cache(cfg.head_dim, cfg.max_positions, cfg.rope_theta)
        self.num_blocks = 0
        self.key_pool = self.value_pool = None
        self._layer_pools: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._one_token_kernels, self._one_token = one_token_kernels, None
        # called after each layer's MoE with ([E_local] rows each local expert received, layer=); the serving
        # engine puts its metrics' record_expert_tokens here (experts rank * E_local .. are this rank's)
        self.on_expert_counts = None

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV pools: every layer's [num_blocks, block_size, KVH, D] keys and values, stacked in one
        [L * num_blocks, ...] tensor each (zeros; block ids are per layer)."""
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise DecoderError.at_caller(f"MoEDecoder.allocate_kv_cache: num_blocks={num_blocks!r} must be a "
                                         "positive integer")
        cfg = self.cfg
        shape = (cfg.num_layers * num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.key_pool = torch.zeros(shape, dtype=cfg.dtype)
        self.value_pool = torch.zeros(shape, dtype=cfg.dtype)
        self.num_blocks = num_blocks
        rows = [slice(layer * num_blocks, (layer + 1) * num_blocks) for layer in range(cfg.num_layers)]
        self._layer_pools = [(self.key_pool[r], self.value_pool[r]) for r in rows]   # (made once: the hot path)
        self._one_token = OneTokenStep.of(cfg, self.weights, self.moe, self._layer_pools, self.cos_sin) \
            if self._one_token_kernels else None

    def kv_cache(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s key and value pools, [num_blocks, block_size, KVH, D] views of the stacked ones."""
        return self._layer_pools[layer]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """[B] int64: the greedy next token of each request (padding rows: unspecified)."""
        return self._step(batch)[0]

    def forward_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """[B, V] FP32: the logits of each request's last token of this step (row qsl[b + 1] - 1)."""
        return self._step(batch)[1]

    def _step(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(greedy tokens [B] int64, logits [B, V] FP32) of each request's last token of this step."""
        longest = self._check(batch)
        cfg, w = self.cfg, self.weights
        heads, eps = (cfg.num_q_heads, cfg.num_kv_heads), cfg.rms_eps
        tokens, requests = batch.num_tokens, batch.num_requests
        live = _live_tokens(batch)
        fused = self._fused_write(batch, live[0])
        if fused is False and self._one_token is not None and batch.is_decode and tokens == requests == 1:
            return self._one_token_step(batch, longest)     # (fused is False: our attention, the token is live)
        hidden = residual = None
        for layer, lw in enumerate(w.layers):
            caches = () if fused is None else (*self.kv_cache(layer), batch.slot_mapping, fused)
            if residual is None:     # the embedding rows start the residual stream
                embed = embed_norm_qkv_rope if fused is None else embed_norm_qkv_rope_cache
                q, k, v, residual = embed(batch.input_ids, w.embed, lw.input_norm, lw.w_qkv, batch.positions,
                                          self.cos_sin, heads, eps, *caches)
            else:
                project = norm_qkv_rope if fused is None else norm_qkv_rope_cache
                q, k, v = project(hidden, residual, lw.input_norm, lw.w_qkv, batch.positions, self.cos_sin, heads,
                                  eps, *caches)
            attn = self._attend(layer, q, k, v, batch, longest, fused is not None)
            if live[0] == tokens:    # no padding rows: the layer may fuse the O projection and its route
                hidden = self.moe[layer].after_out_proj(attn, lw.w_o, residual, lw.post_norm, eps)
            else:
                hidden = self._moe(layer, out_proj_add_norm(attn, lw.w_o, residual, lw.post_norm, eps), live)
            if self.on_expert_counts is not None:
                self.on_expert_counts(self.moe[layer].recv_counts, layer=layer)
        if tokens == 0 or requests == 0:
            return torch.zeros(requests, dtype=torch.int64), torch.zeros(requests, cfg.vocab_size)
        # a decode step's rows are each its request's last (none needs the row gather)
        last = None if batch.is_decode and tokens == requests else \
            (batch.query_start_loc[1:].to(torch.int64) - 1).clamp_min(0)
        return norm_head_greedy(hidden, residual, last, w.final_norm, w.lm_head, eps)

    def _one_token_step(self, batch: ForwardBatch, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, logits, routes = self._one_token.run(batch, longest)
        for layer, (moe, layer_routes) in enumerate(zip(self.moe, routes)):
            moe.note_routes(layer_routes)
            if self.on_expert_counts is not None:
                self.on_expert_counts(moe.recv_counts, layer=layer)
        return tokens, logits

    def _moe(self, layer: int, x: torch.Tensor, live: tuple[int, torch.Tensor | None]) -> torch.Tensor:
        """The layer's MoE on the live tokens only (padding is neither routed nor counted per expert: T = live
        tokens, 0 when none); padding rows of the result are zeros."""
        count, rows = live
        if count == x.shape[0]:
            return self.moe[layer](x)
        out = torch.zeros_like(x)
        if rows is None:
            out[:count] = self.moe[layer](x[:count])
        else:
            out[rows] = self.moe[layer](x[rows])
        return out

    def _fused_write(self, batch: ForwardBatch, live: int) -> bool | None:
        """Whether the step's K/V cache write runs inside the attention-input kernels, as `padded` (some slot is
        -1): None when it does not (another attention module, no live slot, an int32 slot mapping) and
        write_kv_cache does it. The fused kernels trust their slots: they are checked here (one numpy max)."""
        if self.attention is not attention_kernels or live == 0 or batch.slot_mapping.dtype != torch.int64:
            return None
        pool = self.num_blocks * self.block_size
        high = int(batch.slot_mapping.numpy().max())
        if high >= pool:
            raise DecoderError.at_caller(f"MoEDecoder.forward: slot_mapping holds slot {high}, outside the pool's "
                                         f"{pool} slots ({self.num_blocks} blocks of {self.block_size})",
                                         "a slot must be block * block_size + offset, or -1 for padding")
        return live < batch.num_tokens      # (live counts the slots >= 0)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
                longest: int, written: bool) -> torch.Tensor:
        """q [T, QH * D], k, v [T, KVH * D] (rotated) -> the attention output [T, QH * D]; writes the step's K/V
        into the cache unless `written` (the attention-input kernel did). longest: the batch's longest context (it
        sizes the decode's KV tile)."""
        cfg, tokens = self.cfg, batch.num_tokens
        qh, kvh, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        if tokens == 0:
            return q.new_zeros(0, qh * d)
        query, key, value = q.view(tokens, qh, d), k.view(tokens, kvh, d), v.view(tokens, kvh, d)
        key_cache, value_cache = self.kv_cache(layer)
        ops = self.attention
        if not written:
            ops.write_kv_cache(key, value, key_cache, value_cache, batch.slot_mapping)
        if batch.is_decode:
            out = ops.paged_decode_attention(query, key_cache, value_cache, batch.block_tables, batch.seq_lens,
                                             max_seq_len=longest)
        else:
            out = ops.chunked_prefill_attention(query, key_cache, value_cache, batch.block_tables, batch.seq_lens,
                                                batch.query_start_loc)
        return out.reshape(tokens, qh * d)

    def _check(self, batch: ForwardBatch) -> int:
        """The batch's longest context (its max_seq_len, or read from seq_lens when it has none), after checking
        the batch fits the model."""
        fail = DecoderError.at_caller
        if not isinstance(batch, ForwardBatch):
            raise fail(f"MoEDecoder.forward takes a ForwardBatch, got {type(batch).__name__}")
        if self.key_pool is None:
            raise fail("MoEDecoder.forward: no KV cache",
                       "call model.allocate_kv_cache(num_blocks) once before the first step")
        limit = self.cfg.max_tokens_per_rank
        if batch.num_tokens > limit:
            raise fail(f"MoEDecoder.forward: the batch has {batch.num_tokens} tokens, over max_tokens_per_rank="
                       f"{limit}", "schedule fewer tokens per step (a smaller prefill chunk) or raise "
                       "DecoderConfig.max_tokens_per_rank")
        longest = batch.max_seq_len
        if longest is None:
            longest = int(batch.seq_lens.max()) if batch.num_requests else 0
        if longest > self.cfg.max_positions:
            raise fail(f"MoEDecoder.forward: a request reaches {longest} tokens, over max_positions="
                       f"{self.cfg.max_positions} (the rotary table's rows)", "raise DecoderConfig.max_positions")
        if batch.query_start_loc.shape[0] != batch.num_requests + 1:
            raise fail(f"MoEDecoder.forward: query_start_loc has {batch.query_start_loc.shape[0]} entries for "
                       f"{batch.num_requests} requests (block_tables' rows); it needs B + 1")
        return longest


def _live_tokens(batch: ForwardBatch) -> tuple[int, torch.Tensor | None]:
    """(count, rows) of the step's live tokens, those with a cache slot (padding has slot -1): rows is None when
    they are the first `count` tokens (the model runner pads at the end), else their indices."""
    live = batch.slot_mapping.numpy() >= 0      # (numpy on the host tensor: ~10 µs less than torch calls)
    count = int(np.count_nonzero(live))
    return count, None if np.count_nonzero(live[:count]) == count else torch.from_numpy(live.nonzero()[0])
