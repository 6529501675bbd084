"""`DecoderConfig`: the shape of the small MoE decoder (issue 15), checked once at construction, and
`random_state_dict`, its Hugging Face-style weights drawn from a seed.

Every layer is attention (GQA, neox RoPE, paged KV) followed by an MoE layer (`MoELayer`: softmax top-k routing,
SwiGLU experts, an optional shared expert), both behind RMSNorm with residual adds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pypto_rt.kernels.moe import MoEConfig
from pypto_rt.serving.model.decoder_errors import DecoderConfigError

DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 256
    hidden: int = 64
    num_layers: int = 2
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    num_experts: int = 4
    top_k: int = 2
    moe_intermediate: int = 64
    shared_intermediate: int = 64            # 0: no shared expert
    max_tokens_per_rank: int = 64            # the most tokens one step of one rank carries
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    quantize: bool = False                   # W8A8 routed and shared experts
    rope_theta: float = 10000.0
    max_positions: int = 2048
    rms_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "num_experts",
                     "top_k", "moe_intermediate", "max_tokens_per_rank", "block_size", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                _fail(f"{name}={value!r} must be a positive integer")
        if isinstance(self.shared_intermediate, bool) or not isinstance(self.shared_intermediate, int) or \
                self.shared_intermediate < 0:
            _fail(f"shared_intermediate={self.shared_intermediate!r} must be 0 (no shared expert) or positive")
        if self.num_q_heads % self.num_kv_heads:
            _fail(f"num_kv_heads={self.num_kv_heads} does not divide num_q_heads={self.num_q_heads}",
                  "grouped-query attention shares each kv head among num_q_heads // num_kv_heads query heads")
        if self.head_dim % 2:
            _fail(f"head_dim={self.head_dim} must be even (rotary embedding rotates pairs)")
        if self.dtype not in DTYPES:
            _fail(f"dtype={self.dtype} is not supported", f"use one of {', '.join(map(str, DTYPES))}")
        if not isinstance(self.quantize, bool):
            _fail(f"quantize={self.quantize!r} must be True or False")
        if not self.rope_theta > 0 or not self.rms_eps > 0:
            _fail(f"rope_theta={self.rope_theta!r} and rms_eps={self.rms_eps!r} must be positive")
        self.moe_config()

    def moe_config(self) -> MoEConfig:
        """The MoEConfig of every layer's MoE block."""
        return MoEConfig(hidden=self.hidden, num_experts=self.num_experts, top_k=self.top_k,
                         max_tokens_per_rank=self.max_tokens_per_rank, dtype=self.dtype, score_func="softmax",
                         intermediate_size=self.moe_intermediate)

    @property
    def qkv_width(self) -> int:
        return (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim


def _fail(message: str, hint: str | None = None) -> None:
    raise DecoderConfigError.at_caller(f"DecoderConfig: {message}", hint)


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def random_state_dict(cfg: DecoderConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """FP32 weights with Hugging Face names (Qwen2-MoE / DeepSeek style; the MoE block under
    `model.layers.{l}.mlp.` as `load_moe_weights` reads it), drawn from `seed`; projections scaled by
    1 / sqrt(fan_in) so activations stay O(1) through the layers."""
    gen = torch.Generator().manual_seed(seed)

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / cols ** 0.5

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(cfg.hidden, generator=gen)

    h, d = cfg.hidden, cfg.head_dim
    sd = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, h, generator=gen)}
    for layer in range(cfg.num_layers):
        p = layer_prefix(layer)
        sd[p + "input_layernorm.weight"] = norm()
        sd[p + "self_attn.q_proj.weight"] = matrix(cfg.num_q_heads * d, h)
        sd[p + "self_attn.k_proj.weight"] = matrix(cfg.num_kv_heads * d, h)
        sd[p + "self_attn.v_proj.weight"] = matrix(cfg.num_kv_heads * d, h)
        sd[p + "self_attn.o_proj.weight"] = matrix(h, cfg.num_q_heads * d)
        sd[p + "post_attention_layernorm.weight"] = norm()
        sd[p + "mlp.gate.weight"] = matrix(cfg.num_experts, h)
        experts = [(f"experts.{e}", cfg.moe_intermediate) for e in range(cfg.num_experts)]
        if cfg.shared_intermediate:
            experts.append(("shared_experts", cfg.shared_intermediate))
        for name, inter in experts:
            sd[f"{p}mlp.{name}.gate_proj.weight"] = matrix(inter, h)
            sd[f"{p}mlp.{name}.up_proj.weight"] = matrix(inter, h)
            sd[f"{p}mlp.{name}.down_proj.weight"] = matrix(h, inter)
    sd["model.norm.weight"] = norm()
    sd["lm_head.weight"] = matrix(cfg.vocab_size, h)
    return sd
