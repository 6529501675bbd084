"""MoEConfig: valid settings construct, every bad field is one clear error naming it, check_world."""
import pytest
import torch

from pypto_rt.errors import PyptoError
from pypto_rt.kernels.moe import MoEConfig, MoEConfigError

BASE = dict(hidden=64, num_experts=16, top_k=4, max_tokens_per_rank=8)


def make(**changes) -> MoEConfig:
    return MoEConfig(**{**BASE, **changes})


def test_defaults_and_a_grouped_config_construct():
    cfg = make()
    assert (cfg.dtype, cfg.score_func, cfg.norm_topk_prob, cfg.routed_scaling_factor) == \
        (torch.bfloat16, "softmax", True, 1.0)
    assert not cfg.grouped
    grouped = make(num_experts=256, top_k=8, n_group=8, topk_group=4, score_func="sigmoid",
                   routed_scaling_factor=2.5, intermediate_size=128)
    assert grouped.grouped


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        make().top_k = 2


@pytest.mark.parametrize("changes, named", [
    (dict(hidden=0), "hidden=0"),
    (dict(num_experts=-4), "num_experts=-4"),
    (dict(top_k=2.0), "top_k=2.0"),
    (dict(max_tokens_per_rank=True), "max_tokens_per_rank=True"),
    (dict(intermediate_size=0), "intermediate_size=0"),
    (dict(num_experts=4096, top_k=4), "num_experts=4096"),
    (dict(top_k=17), "top_k=17 is larger than num_experts=16"),
    (dict(dtype=torch.int8), "dtype=torch.int8"),
    (dict(score_func="relu"), "score_func='relu'"),
    (dict(norm_topk_prob=1), "norm_topk_prob=1"),
    (dict(routed_scaling_factor=0.0), "routed_scaling_factor=0.0"),
    (dict(n_group=4), "n_group=4 and topk_group=None"),
    (dict(topk_group=2), "n_group=None and topk_group=2"),
    (dict(n_group=3, topk_group=1), "n_group=3 does not divide num_experts=16"),
    (dict(n_group=16, topk_group=4), "n_group=16 leaves 1 expert per group"),
    (dict(n_group=4, topk_group=5), "topk_group=5 is larger than n_group=4"),
    (dict(n_group=4, topk_group=0), "topk_group=0 must be a positive integer"),
    (dict(n_group=8, topk_group=1, top_k=4), "top_k=4 is larger than the 2 experts in the topk_group=1 kept"),
    (dict(num_experts=128, n_group=64, topk_group=8), "n_group=64 is over the gate's limit of 32"),
])
def test_a_bad_field_is_one_error_naming_it(changes, named):
    with pytest.raises(MoEConfigError) as info:
        make(**changes)
    assert isinstance(info.value, PyptoError)
    assert named in info.value.message
    assert info.value.message.startswith("MoEConfig: ")
    assert "\n" not in info.value.message


def test_check_world_returns_local_experts_or_names_the_world_size():
    cfg = make()
    assert cfg.check_world(1) == 16
    assert cfg.check_world(4) == 4
    with pytest.raises(MoEConfigError, match="world size 3 does not divide num_experts=16"):
        cfg.check_world(3)
    with pytest.raises(MoEConfigError, match="world_size=0 must be a positive integer"):
        cfg.check_world(0)


def test_the_error_renders_with_a_hint():
    with pytest.raises(MoEConfigError) as info:
        make().check_world(5)
    assert "= help: run a number of ranks that divides num_experts" in str(info.value)
