"""`load_moe_weights`: one rank's share of an MoE layer from a Hugging Face-style state dict.

Names under `prefix` (e.g. "model.layers.3.mlp." or "model.layers.3.block_sparse_moe."):
    {prefix}gate.weight [E, H]                          the router (both schemes)
    {prefix}gate.e_score_correction_bias [E]            DeepSeek-V3's selection bias (optional)
    {prefix}experts.{i}.w1|w3|w2.weight                 Mixtral: gate, up, down projections
    {prefix}experts.{i}.gate_proj|up_proj|down_proj.weight      DeepSeek
    {prefix}shared_experts.gate_proj|up_proj|down_proj.weight   DeepSeek's shared expert (optional)
A rank reads only its own experts (rank * E_local .. (rank + 1) * E_local - 1), each key once, so a mapping that
loads on access (or a safetensors handle with get_tensor) loads no other rank's tensors. Values may also be
zero-argument callables returning the tensor. Keys not named above are ignored.
"""
from collections.abc import Mapping

import torch

from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, describe
from pypto_rt.kernels.moe.weights import ExpertWeights, MoEWeights, RouterWeights

MIXTRAL = ("w1", "w3", "w2")
DEEPSEEK = ("gate_proj", "up_proj", "down_proj")
ROUTER_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SOURCE_DTYPES = ROUTER_DTYPES + (torch.float64,)    # checkpoint dtypes converted exactly enough to cfg.dtype


class _Source:
    """The state dict under a prefix: `has(name)` (from its key list: a Mapping's own `in` may load the value),
    and `get(name, shape)`, which loads the tensor and checks its shape (None in `shape`: any extent)."""

    def __init__(self, state_dict, prefix: str):
        if not (isinstance(state_dict, Mapping) or hasattr(state_dict, "get_tensor")):
            raise MoEArgumentError.at_caller(
                f"load_moe_weights: state_dict must be a mapping of names to tensors (or a safetensors handle), "
                f"got {type(state_dict).__name__}")
        self.state_dict, self.prefix = state_dict, prefix
        self.keys = frozenset(state_dict.keys())

    def has(self, name: str) -> bool:
        return self.prefix + name in self.keys

    def get(self, name: str, shape: list) -> torch.Tensor:
        key = self.prefix + name
        expected = "[" + ", ".join("?" if n is None else str(n) for n in shape) + "]"
        if not self.has(name):
            raise MoEArgumentError.at_caller(f"load_moe_weights: the state dict has no {key!r} (expected {expected})",
                                             hint="check prefix= and that the checkpoint is the model's MoE layer")
        value = self.state_dict[key] if isinstance(self.state_dict, Mapping) else self.state_dict.get_tensor(key)
        if callable(value) and not isinstance(value, torch.Tensor):
            value = value()
        if isinstance(value, torch.Tensor) and value.dtype.is_floating_point and value.dtype not in SOURCE_DTYPES:
            raise MoEArgumentError.at_caller(
                f"load_moe_weights: {key!r} is {value.dtype}; load_moe_weights reads "
                f"{', '.join(map(str, SOURCE_DTYPES))} weights",
                hint="dequantise a block-scaled FP8 checkpoint (weight * weight_scale_inv) before loading it")
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dim() != len(shape) \
                or any(n is not None and n != got for n, got in zip(shape, value.shape)):
            raise MoEArgumentError.at_caller(f"load_moe_weights: {key!r} is {describe(value)}, expected a "
                                             f"floating-point tensor of shape {expected}")
        return value


def load_moe_weights(cfg: MoEConfig, state_dict, *, rank: int, world: int, prefix: str = "",
                     quantize: bool = False) -> MoEWeights:
    """Rank `rank` of `world`'s weights: the router, its num_experts // world routed experts (in cfg.dtype, or
    int8 per output channel when `quantize`) and the shared expert when the state dict has one."""
    n_local = cfg.check_world(world)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise MoEArgumentError.at_caller(f"load_moe_weights: rank={rank!r} is not in 0..{world - 1} (world={world})")
    source = _Source(state_dict, prefix)
    first = rank * n_local
    names = _scheme(source, first)
    router = _router(cfg, source)
    experts = _stacked(cfg, source, [f"experts.{i}" for i in range(first, first + n_local)], names,
                       cfg.intermediate_size)
    shared = None
    if source.has(f"shared_experts.{DEEPSEEK[0]}.weight"):
        shared = _stacked(cfg, source, ["shared_experts"], DEEPSEEK, None)
    if quantize:
        experts, shared = experts.quantize(), shared and shared.quantize()
    return MoEWeights(router, experts, first, shared)


def _scheme(source: _Source, first: int) -> tuple:
    for names in (MIXTRAL, DEEPSEEK):
        if source.has(f"experts.{first}.{names[0]}.weight"):
            return names
    key = f"{source.prefix}experts.{first}"
    raise MoEArgumentError.at_caller(
        f"load_moe_weights: the state dict has neither {key}.w1.weight (Mixtral) nor {key}.gate_proj.weight "
        f"(DeepSeek)", hint="check prefix= (e.g. 'model.layers.0.block_sparse_moe.' or 'model.layers.1.mlp.')")


def _router(cfg: MoEConfig, source: _Source) -> RouterWeights:
    weight = source.get("gate.weight", [cfg.num_experts, cfg.hidden])
    if weight.dtype not in ROUTER_DTYPES:
        weight = weight.float()
    bias = None
    if source.has("gate.e_score_correction_bias"):
        bias = source.get("gate.e_score_correction_bias", [cfg.num_experts]).float()
    return RouterWeights(weight.contiguous(), bias)


def _stacked(cfg: MoEConfig, source: _Source, experts: list, names: tuple, inter: int | None) -> ExpertWeights:
    """The experts' gate, up and down projections stacked in cfg.dtype; `inter` None: taken from the first."""
    gate_name, up_name, down_name = names
    gates, ups, downs = [], [], []
    for expert in experts:
        gates.append(source.get(f"{expert}.{gate_name}.weight", [inter, cfg.hidden]).to(cfg.dtype))
        inter = gates[-1].shape[0]
        ups.append(source.get(f"{expert}.{up_name}.weight", [inter, cfg.hidden]).to(cfg.dtype))
        downs.append(source.get(f"{expert}.{down_name}.weight", [cfg.hidden, inter]).to(cfg.dtype))
    return ExpertWeights(torch.stack(gates), torch.stack(ups), torch.stack(downs))
