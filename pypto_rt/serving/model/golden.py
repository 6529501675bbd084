"""The decoder's single-process golden: the same maths as `MoEDecoder`, eager torch, one request at a time over
a contiguous per-request KV cache (no blocks, no ranks), and greedy generation.

    golden = GoldenDecoder(cfg, state_dict)
    tokens = golden.generate([[5, 9, 2], [7]], max_new_tokens=4)     # per prompt, its new tokens

Per token: embedding -> per layer [RMSNorm (+ residual) -> QKV -> neox RoPE -> causal GQA attention (FP32
softmax) -> O proj -> RMSNorm (+ residual) -> MoE (+ shared expert)] -> final RMSNorm (+ residual) -> LM head
(FP32 logits) -> argmax (lowest id on ties). Linear layers accumulate in FP32 and round once to the dtype.
"""
from __future__ import annotations

import torch

from pypto_rt.kernels.layers.golden import embedding_golden, linear_golden, rms_norm_golden, rotary_golden
from pypto_rt.kernels.layers.rope import rope_cache
from pypto_rt.kernels.moe import load_moe_weights
from pypto_rt.kernels.moe.golden import moe_layer_golden
from pypto_rt.serving.model.config import DecoderConfig, layer_prefix
from pypto_rt.serving.model.dense_weights import load_dense_weights


class RequestCache:
    """One request's keys and values per layer, [L, KVH, D] each, grown by every step."""

    def __init__(self, cfg: DecoderConfig):
        empty = torch.zeros(0, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype)
        self.keys = [empty] * cfg.num_layers
        self.values = [empty] * cfg.num_layers

    @property
    def length(self) -> int:
        return self.keys[0].shape[0]


def attention_golden(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int) -> torch.Tensor:
    """q [n, QH, D] at positions first .. first + n - 1 over keys/values [L, KVH, D]: causal GQA in FP32."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * q.shape[-1] ** -0.5
    visible = torch.arange(k.shape[0])[None, :] <= torch.arange(first, first + q.shape[0])[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, v).to(q.dtype)


class GoldenDecoder:
    def __init__(self, cfg: DecoderConfig, state_dict):
        self.cfg = cfg
        self.weights = load_dense_weights(cfg, state_dict)
        self.moe_cfg = cfg.moe_config()
        self.moe = [load_moe_weights(self.moe_cfg, state_dict, rank=0, world=1, prefix=layer_prefix(layer) + "mlp.",
                                     quantize=cfg.quantize) for layer in range(cfg.num_layers)]
        self.cos_sin = rope_cache(cfg.head_dim, cfg.max_positions, cfg.rope_theta)

    def step(self, cache: RequestCache, ids: list[int]) -> torch.Tensor:
        """Run one request's new tokens `ids` after its cached context (appended to `cache`); returns the FP32
        logits [V] of the last one."""
        cfg, w = self.cfg, self.weights
        n, first, qh, kvh, d = len(ids), cache.length, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        positions = torch.arange(first, first + n)
        hidden = embedding_golden(torch.tensor(ids), w.embed)
        residual = None
        for layer, lw in enumerate(w.layers):
            if residual is None:
                residual, normed = hidden, rms_norm_golden(hidden, lw.input_norm, cfg.rms_eps)
            else:
                normed, residual = rms_norm_golden(hidden, lw.input_norm, cfg.rms_eps, residual)
            qkv = linear_golden(normed, lw.w_qkv)
            q = rotary_golden(qkv[:, :qh * d].reshape(n, qh, d), positions, self.cos_sin)
            k = rotary_golden(qkv[:, qh * d:(qh + kvh) * d].reshape(n, kvh, d), positions, self.cos_sin)
            cache.keys[layer] = torch.cat([cache.keys[layer], k])
            cache.values[layer] = torch.cat([cache.values[layer], qkv[:, (qh + kvh) * d:].reshape(n, kvh, d)])
            attn = attention_golden(q, cache.keys[layer], cache.values[layer], first)
            hidden = linear_golden(attn.reshape(n, qh * d), lw.w_o)
            normed, residual = rms_norm_golden(hidden, lw.post_norm, cfg.rms_eps, residual)
            hidden = moe_layer_golden(self.moe_cfg, self.moe[layer], normed)
        last, _ = rms_norm_golden(hidden[-1:], w.final_norm, cfg.rms_eps, residual[-1:])
        return linear_golden(last, w.lm_head, torch.float32)[0]

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[list[int]]:
        """Greedy generation, request after request: each prompt's max_new_tokens new tokens (an int for all, or
        one per prompt)."""
        counts = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        results = []
        for prompt, count in zip(prompts, counts):
            cache, new, ids = RequestCache(self.cfg), [], list(prompt)
            while len(new) < count:
                ids = [int(self.step(cache, ids).argmax())]
                new += ids
            results.append(new)
        return results
