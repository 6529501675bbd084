"""The decoder's dense weights (everything but the MoE blocks, which `load_moe_weights` reads) from its state
dict, in the config's dtype: the q, k and v projections of a layer stacked into one [(QH + 2 KVH) * D, H]
matrix (one GEMM per layer), norms as [H] vectors."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pypto_rt.serving.model.config import DecoderConfig, layer_prefix
from pypto_rt.serving.model.decoder_errors import DecoderError


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor        # [H]
    w_qkv: torch.Tensor             # [(QH + 2 KVH) * D, H]: q rows, then k, then v
    w_o: torch.Tensor               # [H, QH * D]
    post_norm: torch.Tensor         # [H]


@dataclass(frozen=True)
class DenseWeights:
    embed: torch.Tensor             # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor        # [H]
    lm_head: torch.Tensor           # [V, H]


def load_dense_weights(cfg: DecoderConfig, state_dict) -> DenseWeights:
    h, d = cfg.hidden, cfg.head_dim

    def get(name: str, shape: list[int]) -> torch.Tensor:
        if name not in state_dict:
            raise DecoderError.at_caller(f"MoEDecoder: the state dict has no {name!r} (expected {shape})",
                                         "build it with random_state_dict(cfg, seed) or a checkpoint of this shape")
        value = state_dict[name]
        if not isinstance(value, torch.Tensor) or list(value.shape) != shape:
            got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise DecoderError.at_caller(f"MoEDecoder: {name!r} is {got}, the config expects {shape}")
        return value.to(cfg.dtype).contiguous()

    layers = []
    for layer in range(cfg.num_layers):
        p = layer_prefix(layer) + "self_attn."
        qkv = [get(p + "q_proj.weight", [cfg.num_q_heads * d, h]), get(p + "k_proj.weight", [cfg.num_kv_heads * d, h]),
               get(p + "v_proj.weight", [cfg.num_kv_heads * d, h])]
        layers.append(LayerWeights(get(layer_prefix(layer) + "input_layernorm.weight", [h]), torch.cat(qkv),
                                   get(p + "o_proj.weight", [h, cfg.num_q_heads * d]),
                                   get(layer_prefix(layer) + "post_attention_layernorm.weight", [h])))
    return DenseWeights(get("model.embed_tokens.weight", [cfg.vocab_size, h]), layers,
                        get("model.norm.weight", [h]), get("lm_head.weight", [cfg.vocab_size, h]))
