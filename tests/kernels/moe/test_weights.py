"""Loading one rank's MoE weights from Hugging Face-style state dicts, and per-channel int8 quantisation."""
from collections.abc import Mapping

import pytest
import torch

from pypto_rt.kernels.moe import MoEArgumentError, MoEConfig, MoEConfigError, run_experts, shared_expert
from pypto_rt.kernels.moe.golden import experts_golden, shared_expert_golden
from pypto_rt.kernels.moe.loading import load_moe_weights
from pypto_rt.kernels.moe.weights import ExpertWeights, QuantizedExpertWeights, quantize_rows

H, I, E, I_SHARED = 16, 24, 8, 32
CFG = MoEConfig(hidden=H, num_experts=E, top_k=2, max_tokens_per_rank=4, intermediate_size=I)


def mixtral(prefix: str = "model.layers.0.block_sparse_moe.") -> dict:
    gen = torch.Generator().manual_seed(1)
    sd = {f"{prefix}gate.weight": torch.randn(E, H, generator=gen).bfloat16()}
    for i in range(E):
        for name, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
            sd[f"{prefix}experts.{i}.{name}.weight"] = torch.randn(shape, generator=gen).bfloat16()
    return sd


def deepseek(prefix: str = "model.layers.3.mlp.") -> dict:
    gen = torch.Generator().manual_seed(2)
    sd = {f"{prefix}gate.weight": torch.randn(E, H, generator=gen),
          f"{prefix}gate.e_score_correction_bias": torch.randn(E, generator=gen),
          f"{prefix}unrelated.weight": torch.zeros(3)}
    for expert, inter in [(f"experts.{i}", I) for i in range(E)] + [("shared_experts", I_SHARED)]:
        for name, shape in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            sd[f"{prefix}{expert}.{name}.weight"] = torch.randn(shape, generator=gen).bfloat16()
    return sd


class CountingDict(Mapping):
    """A state dict that loads on access and counts the loads per key."""

    def __init__(self, tensors: dict):
        self.tensors, self.loads = tensors, {}

    def __getitem__(self, key):
        self.loads[key] = self.loads.get(key, 0) + 1
        return self.tensors[key]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)


def test_mixtral_names_load_only_this_ranks_experts_once_each():
    prefix = "model.layers.0.block_sparse_moe."
    sd = CountingDict(mixtral(prefix))
    weights = load_moe_weights(CFG, sd, rank=1, world=2, prefix=prefix)
    own = {f"{prefix}experts.{i}.{n}.weight" for i in range(4, 8) for n in ("w1", "w2", "w3")}
    assert sd.loads == {key: 1 for key in own | {f"{prefix}gate.weight"}}
    assert weights.first_expert == 4 and weights.shared is None and weights.router.bias is None
    experts = weights.experts
    assert isinstance(experts, ExpertWeights) and experts.w_gate.shape == (4, I, H)
    for local, i in enumerate(range(4, 8)):
        assert torch.equal(experts.w_gate[local], sd.tensors[f"{prefix}experts.{i}.w1.weight"])
        assert torch.equal(experts.w_up[local], sd.tensors[f"{prefix}experts.{i}.w3.weight"])
        assert torch.equal(experts.w_down[local], sd.tensors[f"{prefix}experts.{i}.w2.weight"])
    assert torch.equal(weights.router.weight, sd.tensors[f"{prefix}gate.weight"])


def test_deepseek_names_with_bias_and_shared_expert_quantised_at_load():
    prefix = "model.layers.3.mlp."
    sd = deepseek(prefix)
    weights = load_moe_weights(CFG, sd, rank=0, world=4, prefix=prefix, quantize=True)
    assert weights.first_expert == 0 and weights.experts.experts == 2
    assert isinstance(weights.experts, QuantizedExpertWeights) and isinstance(weights.shared, QuantizedExpertWeights)
    assert weights.shared.w_gate.shape == (1, I_SHARED, H) and weights.shared.down_scale.shape == (1, H)
    assert torch.equal(weights.router.bias, sd[f"{prefix}gate.e_score_correction_bias"])
    assert weights.router.weight.dtype == torch.float32       # the FP32 gate is kept as it is
    source = sd[f"{prefix}experts.1.down_proj.weight"].float()
    restored = weights.experts.w_down[1].float() * weights.experts.down_scale[1].unsqueeze(-1)
    step = source.abs().amax(dim=-1, keepdim=True) / 127
    assert ((restored - source).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("quantize", [False, True])
def test_loaded_weights_run_in_the_expert_kernels(quantize):
    weights = load_moe_weights(CFG, deepseek(""), rank=1, world=2, quantize=quantize)
    gen = torch.Generator().manual_seed(3)
    recv_x, counts = torch.randn(4, 8, H, generator=gen).bfloat16(), torch.tensor([8, 0, 3, 5], dtype=torch.int32)
    torch.testing.assert_close(run_experts(CFG, weights.experts, recv_x, counts),
                               experts_golden(CFG, weights.experts, recv_x, counts), rtol=1.6e-2, atol=1e-2)
    x = recv_x[0, :5]
    torch.testing.assert_close(shared_expert(CFG, weights.shared, x), shared_expert_golden(CFG, weights.shared, x),
                               rtol=1.6e-2, atol=1e-2)


def test_lazy_getters_of_other_ranks_are_never_called():
    called = []

    def lazy(key, tensor):
        return lambda: called.append(key) or tensor

    sd = {key: lazy(key, value) for key, value in mixtral("").items()}
    weights = load_moe_weights(CFG, sd, rank=0, world=4)
    assert sorted(called) == sorted(["gate.weight"] + [f"experts.{i}.w{n}.weight" for i in (0, 1) for n in (1, 2, 3)])
    assert weights.experts.experts == 2


def test_a_safetensors_style_handle_is_read_through_get_tensor():
    class Handle:
        def __init__(self, tensors):
            self.tensors = tensors

        def keys(self):
            return list(self.tensors)

        def get_tensor(self, key):
            return self.tensors[key]

    weights = load_moe_weights(CFG, Handle(deepseek("")), rank=3, world=4)
    assert weights.first_expert == 6 and weights.shared.experts == 1


def test_weights_are_converted_to_the_config_dtype():
    sd = {key: value.float() for key, value in mixtral("").items()}
    weights = load_moe_weights(MoEConfig(hidden=H, num_experts=E, top_k=2, max_tokens_per_rank=4,
                                         dtype=torch.float16), sd, rank=0, world=1)
    assert weights.experts.w_down.dtype == torch.float16 and weights.experts.experts == E


@pytest.mark.parametrize("edit, named", [
    (lambda sd: sd.pop("experts.5.w2.weight"), "the state dict has no 'experts.5.w2.weight' (expected [16, 24])"),
    (lambda sd: sd.update({"experts.4.w3.weight": torch.zeros(I, H + 1)}),
     "'experts.4.w3.weight' is torch.float32 [24, 17], expected a floating-point tensor of shape [24, 16]"),
    (lambda sd: sd.update({"gate.weight": torch.zeros(E - 1, H)}), "'gate.weight' is torch.float32 [7, 16]"),
    (lambda sd: sd.pop("gate.weight"), "no 'gate.weight' (expected [8, 16])"),
    (lambda sd: sd.update({"experts.4.w1.weight": torch.zeros(I, H, dtype=torch.int8)}), "expected a floating-point"),
    (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("experts.4.")], "neither experts.4.w1.weight (Mixtral)"),
    (lambda sd: sd.update({"experts.6.w1.weight": torch.zeros(I, H, dtype=torch.float8_e4m3fn)}),
     "'experts.6.w1.weight' is torch.float8_e4m3fn; load_moe_weights reads"),
])
def test_missing_or_misshaped_keys_are_errors_naming_the_key_and_shape(edit, named):
    sd = mixtral("")
    edit(sd)
    with pytest.raises(MoEArgumentError) as info:
        load_moe_weights(CFG, sd, rank=1, world=2)
    assert named in info.value.message
    assert info.value.span.file == __file__


def test_other_ranks_broken_keys_do_not_matter():
    sd = mixtral("")
    sd.pop("experts.0.w1.weight")
    sd["experts.7.w2.weight"] = torch.zeros(1)
    assert load_moe_weights(CFG, sd, rank=1, world=4).first_expert == 2


def test_bad_rank_world_or_state_dict():
    with pytest.raises(MoEConfigError, match="world size 3 does not divide num_experts=8"):
        load_moe_weights(CFG, mixtral(""), rank=0, world=3)
    with pytest.raises(MoEArgumentError, match=r"rank=2 is not in 0..1"):
        load_moe_weights(CFG, mixtral(""), rank=2, world=2)
    with pytest.raises(MoEArgumentError, match="state_dict must be a mapping"):
        load_moe_weights(CFG, [1, 2], rank=0, world=2)


def test_quantize_rows_is_symmetric_per_output_channel():
    weight = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.5, -0.75]])
    quantized, scale = quantize_rows(weight)
    assert quantized.dtype == torch.int8 and scale.dtype == torch.float32
    assert quantized[0].tolist() == [64, -127, 32] and quantized[2].tolist() == [127, 64, -32]
    assert quantized[1].tolist() == [0, 0, 0] and scale[1] > 0
    torch.testing.assert_close(scale[[0, 2]], torch.tensor([1.0, 3.0]) / 127)


def test_quantized_weights_check_their_dtypes():
    q = ExpertWeights(*(torch.zeros(2, I, H), torch.zeros(2, I, H), torch.zeros(2, H, I))).quantize()
    with pytest.raises(MoEArgumentError, match="down_scale must be a torch.float32 tensor"):
        QuantizedExpertWeights(q.w_gate, q.gate_scale, q.w_up, q.up_scale, q.w_down, q.down_scale.half())
    with pytest.raises(MoEArgumentError, match=r"up_scale must be \[2, 24\]"):
        QuantizedExpertWeights(q.w_gate, q.gate_scale, q.w_up, q.up_scale[:1], q.w_down, q.down_scale)
