"""The weights of one rank's share of an MoE layer, in the forms the kernels take.

Expert FFN weights stack `n` experts in the Hugging Face layout: w_gate, w_up [n, I, H] and w_down [n, H, I]
(`ExpertWeights`, in the model dtype), or the same quantised per output channel to symmetric int8 with FP32
scales [n, I], [n, I], [n, H] (`QuantizedExpertWeights`, W8A8). A shared expert is one such stack with n = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pypto_rt.kernels.moe.ffn import AMAX_EPS, INT8_MAX


@dataclass(frozen=True)
class ExpertWeights:
    """`n` experts' SwiGLU weights in the model dtype: w_gate, w_up [n, I, H], w_down [n, H, I]."""
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    quantized = False

    @property
    def experts(self) -> int:
        return self.w_gate.shape[0]

    @property
    def inter(self) -> int:
        return self.w_gate.shape[1]

    @property
    def hidden(self) -> int:
        return self.w_gate.shape[2]

    def quantize(self) -> "QuantizedExpertWeights":
        """These weights as symmetric int8 per output channel (rows of each matrix), with FP32 scales."""
        (gate, gate_scale), (up, up_scale), (down, down_scale) = map(quantize_rows, (self.w_gate, self.w_up,
                                                                                     self.w_down))
        return QuantizedExpertWeights(gate, gate_scale, up, up_scale, down, down_scale)


@dataclass(frozen=True)
class QuantizedExpertWeights:
    """`n` experts' SwiGLU weights as int8 with a scale per output channel: w_gate, w_up [n, I, H] INT8 with
    gate_scale, up_scale [n, I] FP32; w_down [n, H, I] INT8 with down_scale [n, H] FP32 (weight = int8 * scale)."""
    w_gate: torch.Tensor
    gate_scale: torch.Tensor
    w_up: torch.Tensor
    up_scale: torch.Tensor
    w_down: torch.Tensor
    down_scale: torch.Tensor

    quantized = True
    experts = ExpertWeights.experts
    inter = ExpertWeights.inter
    hidden = ExpertWeights.hidden


@dataclass(frozen=True)
class RouterWeights:
    """The router: weight [E, H] (logits = x @ weight.T) and the selection-only bias [E] (DeepSeek-V3's
    e_score_correction_bias; None where the model has none)."""
    weight: torch.Tensor
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class MoEWeights:
    """What one rank holds of an MoE layer: the router (whole), its own routed experts (global ids
    first_expert .. first_expert + experts.experts - 1) and the shared expert (None where the model has none)."""
    router: RouterWeights
    experts: ExpertWeights | QuantizedExpertWeights
    first_expert: int
    shared: ExpertWeights | QuantizedExpertWeights | None = None


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight [..., N, K]` as (int8 [..., N, K], FP32 scale [..., N]) with weight ~= int8 * scale: a symmetric
    scale per output channel (row), amax / 127, rounded half to even."""
    rows = weight.float()
    scale = rows.abs().amax(dim=-1).clamp_min(AMAX_EPS) / INT8_MAX
    quantized = torch.round(rows / scale.unsqueeze(-1)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return quantized.contiguous(), scale.contiguous()
