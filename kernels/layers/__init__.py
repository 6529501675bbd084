"""Decoder building blocks as DSL kernels (issue 15): embedding, RMSNorm (optionally fused with the residual
add), rotary embedding (neox style), a linear layer / LM head and greedy sampling; and fused kernels for what a
decoder runs back to back on the same rows: [embedding or residual add, norm, QKV, RoPE], [O proj, residual add,
norm], [final add, norm, LM head, greedy]. Torch goldens in golden.py."""
from pypto_rt.kernels.layers.attention_input import embed_norm_qkv_rope, norm_qkv_rope
from pypto_rt.kernels.layers.common import LayerArgumentError
from pypto_rt.kernels.layers.embedding import embedding
from pypto_rt.kernels.layers.linear import linear
from pypto_rt.kernels.layers.lm_head import norm_head_greedy
from pypto_rt.kernels.layers.norm import rms_norm
from pypto_rt.kernels.layers.out_norm import out_proj_add_norm
from pypto_rt.kernels.layers.rope import rope_cache, rotary_embedding
from pypto_rt.kernels.layers.sampling import greedy

__all__ = ["embedding", "rms_norm", "rope_cache", "rotary_embedding", "linear", "greedy", "norm_qkv_rope",
           "embed_norm_qkv_rope", "out_proj_add_norm", "norm_head_greedy", "LayerArgumentError"]
