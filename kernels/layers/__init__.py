"""Decoder building blocks as DSL kernels (issue 15): embedding, RMSNorm (optionally fused with the residual
add), rotary embedding (neox style), a linear layer / LM head and greedy sampling. Torch goldens in golden.py."""
from pypto_rt.kernels.layers.common import LayerArgumentError
from pypto_rt.kernels.layers.embedding import embedding
from pypto_rt.kernels.layers.linear import linear
from pypto_rt.kernels.layers.norm import rms_norm
from pypto_rt.kernels.layers.rope import rope_cache, rotary_embedding
from pypto_rt.kernels.layers.sampling import greedy

__all__ = ["embedding", "rms_norm", "rope_cache", "rotary_embedding", "linear", "greedy", "LayerArgumentError"]
