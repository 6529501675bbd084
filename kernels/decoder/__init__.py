"""Kernels that fuse a decoder's stages across the attention, layer and MoE modules: one decode token through the
whole model in L + 1 kernel calls (one_token.py)."""
from pypto_rt.kernels.decoder.one_token import (OneTokenShape, first_layer_kernel, head_kernel, next_layer_kernel)

__all__ = ["OneTokenShape", "first_layer_kernel", "next_layer_kernel", "head_kernel"]
