"""`MoEConfig`: the shape of one MoE layer and its gate settings, checked once at construction.

Invariants after `__post_init__`: every size is positive, top_k <= num_experts, and group-limited routing
(n_group, topk_group) is either fully off (both None) or consistent: n_group divides num_experts into groups of
at least two experts (a group's score is the sum of its top two), and the kept groups hold at least top_k experts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pypto_rt.kernels.moe.moe_errors import MoEConfigError

SCORE_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_EXPERTS = 2048          # the gate sorts a padded row of at most 2048 slots (sort32 + three merges)
MAX_GROUPS = 32             # group scores are sorted in one sort32 block


def _fail(message: str, hint: str | None = None) -> None:
    raise MoEConfigError(f"MoEConfig: {message}", hint=hint)


@dataclass(frozen=True)
class MoEConfig:
    hidden: int
    num_experts: int
    top_k: int
    max_tokens_per_rank: int
    dtype: torch.dtype = torch.bfloat16
    score_func: str = "softmax"
    n_group: int | None = None
    topk_group: int | None = None
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    intermediate_size: int | None = None
    swiglu_limit: float | None = None       # experts clamp gate <= limit, -limit <= up <= limit (None: no clamp)

    def __post_init__(self) -> None:
        for name in ("hidden", "num_experts", "top_k", "max_tokens_per_rank"):
            _check_positive(name, getattr(self, name))
        if self.intermediate_size is not None:
            _check_positive("intermediate_size", self.intermediate_size)
        if self.num_experts > MAX_EXPERTS:
            _fail(f"num_experts={self.num_experts} is over the gate's limit of {MAX_EXPERTS}")
        if self.top_k > self.num_experts:
            _fail(f"top_k={self.top_k} is larger than num_experts={self.num_experts}",
                  "a token picks top_k distinct experts: lower top_k or raise num_experts")
        if self.dtype not in DTYPES:
            _fail(f"dtype={self.dtype} is not supported", f"use one of {', '.join(map(str, DTYPES))}")
        if self.score_func not in SCORE_FUNCS:
            _fail(f"score_func={self.score_func!r} is not one of {', '.join(map(repr, SCORE_FUNCS))}")
        if not isinstance(self.norm_topk_prob, bool):
            _fail(f"norm_topk_prob={self.norm_topk_prob!r} must be True or False")
        factor = self.routed_scaling_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            _fail(f"routed_scaling_factor={factor!r} must be a positive number")
        limit = self.swiglu_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0):
            _fail(f"swiglu_limit={limit!r} must be a positive number or None")
        self._check_groups()

    def _check_groups(self) -> None:
        n_group, topk_group = self.n_group, self.topk_group
        if n_group is None and topk_group is None:
            return
        if n_group is None or topk_group is None:
            _fail(f"n_group={n_group} and topk_group={topk_group}: set both for group-limited routing, or neither")
        _check_positive("n_group", n_group)
        _check_positive("topk_group", topk_group)
        if n_group > MAX_GROUPS:
            _fail(f"n_group={n_group} is over the gate's limit of {MAX_GROUPS}")
        if self.num_experts % n_group:
            _fail(f"n_group={n_group} does not divide num_experts={self.num_experts}")
        if self.num_experts // n_group < 2:
            _fail(f"n_group={n_group} leaves {self.num_experts // n_group} expert per group; a group's score is "
                  f"the sum of its top two experts", "use at most num_experts // 2 groups")
        if topk_group > n_group:
            _fail(f"topk_group={topk_group} is larger than n_group={n_group}")
        kept = topk_group * (self.num_experts // n_group)
        if self.top_k > kept:
            _fail(f"top_k={self.top_k} is larger than the {kept} experts in the topk_group={topk_group} kept groups")

    @property
    def grouped(self) -> bool:
        """True when routing is group-limited (DeepSeek-V3 style)."""
        return self.n_group is not None

    def check_world(self, world_size: int) -> int:
        """The number of local experts per rank for `world_size` ranks; an error if it does not divide E."""
        _check_positive("world_size", world_size, prefix="")
        if self.num_experts % world_size:
            raise MoEConfigError(
                f"world size {world_size} does not divide num_experts={self.num_experts}",
                hint="run a number of ranks that divides num_experts (every rank holds the same number of experts)")
        return self.num_experts // world_size


def _check_positive(name: str, value, prefix: str = "MoEConfig: ") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MoEConfigError(f"{prefix}{name}={value!r} must be a positive integer")
