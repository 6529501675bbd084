"""The weights of one rank's share of an MoE layer, in the forms the kernels take.

Expert FFN weights stack `n` experts in the Hugging Face layout: w_gate, w_up [n, I, H] and w_down [n, H, I]
(`ExpertWeights`, in the model dtype), or the same quantised per output channel to symmetric int8 with FP32
scales [n, I], [n, I], [n, H] (`QuantizedExpertWeights`, W8A8). A shared expert is one such stack with n = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pypto_rt.kernels.moe.ffn import AMAX_EPS, INT8_MAX, PL_DTYPES
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, describe


@dataclass(frozen=True)
class ExpertWeights:
    """`n` experts' SwiGLU weights in the model dtype: w_gate, w_up [n, I, H], w_down [n, H, I]."""
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    quantized = False

    def __post_init__(self):
        _check_stack(self, [("w_gate", None), ("w_up", None), ("w_down", None)])

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

    def __post_init__(self):
        _check_stack(self, [("w_gate", torch.int8), ("gate_scale", torch.float32), ("w_up", torch.int8),
                            ("up_scale", torch.float32), ("w_down", torch.int8), ("down_scale", torch.float32)])

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


def _check_stack(weights, fields: list) -> None:
    """Each field is a tensor of its dtype (None: the model dtypes, all the same) and the shapes agree with w_gate
    [n, I, H]; an error naming the field otherwise."""
    kind = type(weights).__name__
    for name, dtype in fields:
        value = getattr(weights, name)
        if not isinstance(value, torch.Tensor) or (value.dtype != dtype if dtype else value.dtype not in PL_DTYPES):
            want = dtype or " or ".join(map(str, PL_DTYPES))
            raise MoEArgumentError.at_caller(f"{kind}: {name} must be a {want} tensor, got {describe(value)}")
    if weights.w_gate.dim() != 3:
        raise MoEArgumentError.at_caller(f"{kind}: w_gate must be [experts, intermediate, hidden], got "
                                         f"{describe(weights.w_gate)}")
    n, inter, hidden = weights.w_gate.shape
    shapes = {"w_up": [n, inter, hidden], "w_down": [n, hidden, inter], "gate_scale": [n, inter],
              "up_scale": [n, inter], "down_scale": [n, hidden]}
    for name, _ in fields:
        value = getattr(weights, name)
        if name in shapes and list(value.shape) != shapes[name]:
            raise MoEArgumentError.at_caller(f"{kind}: {name} must be {shapes[name]} to match w_gate "
                                             f"{list(weights.w_gate.shape)}, got {describe(value)}")
        if name in ("w_up", "w_down") and value.dtype != weights.w_gate.dtype:
            raise MoEArgumentError.at_caller(f"{kind}: {name} is {value.dtype}, w_gate is {weights.w_gate.dtype}")

