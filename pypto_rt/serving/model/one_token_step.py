"""MoEDecoder's decode step of one token on one rank in L + 1 kernel calls (kernels.decoder.one_token), where the
per-stage path makes 4 L + 1: what a batch-1 serving step costs is mostly its calls' entries and host checks.

    step = OneTokenStep.of(cfg, weights, moe_layers, layer_pools, cos_sin)   # None: a layer is not in that form
    tokens, logits, routes = step.run(batch, longest)                        # batch: one live decode token

The arguments each kernel takes are the model's own and are bound once here (the weights as the kernels take
them, each layer's cache views); a step checks only its batch's tables (MoEDecoder checked the rest: its slot is
inside the pool, its lengths within max_positions) and allocates its outputs.
"""
from __future__ import annotations

import torch

from pypto_rt.kernels.attention.attention_calls import check_max_seq_len, check_tables, explain_lengths
from pypto_rt.kernels.attention.paged import AttnShape, decode_tile
from pypto_rt.kernels.decoder import OneTokenShape, first_layer_kernel, head_kernel, next_layer_kernel
from pypto_rt.kernels.layers.attention_input import QkvShape
from pypto_rt.kernels.tile_casts import PL_DTYPES


class OneTokenStep:
    def __init__(self, cfg, weights, forms: list, layer_pools: list, cos_sin: torch.Tensor):
        self.cfg, self.cos_sin, self.forms = cfg, cos_sin.contiguous(), forms
        hidden = cfg.hidden
        self.embed, self.lm_head = weights.embed.contiguous(), weights.lm_head.contiguous()
        self.final_norm = weights.final_norm.view(1, hidden)
        # per layer: (weight, w_qkv, the caches, w_o, post_weight, router, bias); a step puts its own tensors
        # (positions, cos|sin, slots; tables, lengths) between them in the kernels' argument order
        self.layers = [(lw.input_norm.view(1, hidden), lw.w_qkv.contiguous(), keys, values, lw.w_o.contiguous(),
                        lw.post_norm.view(1, hidden), form.router, form.bias)
                       for lw, form, (keys, values) in zip(weights.layers, forms, layer_pools)]
        self.qkv = QkvShape(hidden, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cos_sin.shape[0], cfg.dtype,
                            float(cfg.rms_eps))
        self._shapes: dict[tuple[int, int], OneTokenShape] = {}

    @classmethod
    def of(cls, cfg, weights, moe_layers: list, layer_pools: list, cos_sin: torch.Tensor) -> "OneTokenStep | None":
        """The step for these caches, or None where a MoE layer does not run the one-token hit-experts form."""
        forms = [layer.one_token_form() for layer in moe_layers]
        return None if any(form is None for form in forms) else cls(cfg, weights, forms, layer_pools, cos_sin)

    def _shape(self, max_blocks: int, kv_tile: int) -> OneTokenShape:
        key = (max_blocks, kv_tile)
        shape = self._shapes.get(key)
        if shape is None:
            cfg = self.cfg
            attn = AttnShape(cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.block_size, max_blocks,
                             PL_DTYPES[cfg.dtype], cfg.head_dim ** -0.5)
            shape = self._shapes[key] = OneTokenShape(self.qkv, attn, kv_tile, self.forms[0].shape)
        return shape

    def run(self, batch, longest: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """(greedy token [1] int64, logits [1, V] FP32, each layer's routes [1, K] INT32) of a decode batch of one
        live token whose context is `longest` long."""
        tables, lens = batch.block_tables, batch.seq_lens
        check_tables(tables, lens)
        shape = self._shape(tables.shape[1], decode_tile(self.cfg.block_size, longest))
        check_max_seq_len(longest, shape.attn)
        cfg, hidden, top_k = self.cfg, self.cfg.hidden, self.cfg.top_k
        ids, pos = batch.input_ids.to(torch.int64).view(1, 1), batch.positions.to(torch.int64).view(1, 1)
        slots, cos_sin = batch.slot_mapping, self.cos_sin
        residual = torch.empty(1, hidden, dtype=cfg.dtype)
        x = routes = route_weights = None
        every_route = []
        try:
            for layer, (weight, w_qkv, keys, values, w_o, post, router, bias) in enumerate(self.layers):
                normed = torch.empty(1, hidden, dtype=cfg.dtype)
                new_routes = torch.empty(1, top_k, dtype=torch.int32)
                new_weights = torch.empty(1, top_k, dtype=torch.float32)
                attention = (weight, w_qkv, pos, cos_sin, slots, keys, values, tables, lens, w_o, post, router, bias)
                if layer == 0:
                    first_layer_kernel(shape, cfg.vocab_size)(ids, self.embed, *attention, residual, normed,
                                                              new_routes, new_weights)
                else:
                    previous = self.forms[layer - 1]
                    next_layer_kernel(shape)(x, routes, route_weights, previous.gate_up, previous.down, residual,
                                             *attention, normed, new_routes, new_weights)
                x, routes, route_weights = normed, new_routes, new_weights
                every_route.append(routes)
        except Exception as error:
            explain_lengths(lens, shape.attn, error)
            raise
        last = self.forms[-1]
        tokens = torch.empty(1, 1, dtype=torch.int64)
        logits = torch.empty(1, cfg.vocab_size, dtype=torch.float32)
        head_kernel(shape, cfg.vocab_size)(x, routes, route_weights, last.gate_up, last.down, residual,
                                           self.final_norm, self.lm_head, tokens, logits)
        return tokens.view(-1), logits, every_route
