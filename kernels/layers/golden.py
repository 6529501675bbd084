"""Torch goldens for the layer kernels, written from the published formulas (HF Llama / Qwen modules)."""
import math

import torch


def embedding_golden(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(ids.long(), table)


def rms_norm_golden(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """RMSNorm in FP32, rounded once; with residual: (out, x + residual rounded to the dtype)."""
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return out if residual is None else (out, x)


def rotary_golden(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (HF's rotate_half) of x [T, heads, D] or [T, heads * D]."""
    head_dim = cos_sin.shape[1]
    heads = x.reshape(x.shape[0], math.prod(x.shape[1:]) // head_dim, head_dim).float()
    half = head_dim // 2
    cos, sin = cos_sin[positions.long(), :half], cos_sin[positions.long(), half:]
    cos, sin = torch.cat([cos, cos], dim=-1).unsqueeze(1), torch.cat([sin, sin], dim=-1).unsqueeze(1)
    rotated = torch.cat([-heads[..., half:], heads[..., :half]], dim=-1)
    return (heads * cos + rotated * sin).to(x.dtype).view(x.shape)


def linear_golden(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return (x.float() @ weight.float().T).to(out_dtype or x.dtype)


def greedy_golden(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row, the lowest id on ties (torch.argmax returns the first maximal index)."""
    return logits.argmax(dim=-1)
