"""bench.serving_step_split's probe puts back what it wraps (the decoder's layer functions, the attention call, the
MoE layer's and every kernel's entry) and reports each part of the batch-1 step, the kernels' and their replays."""
import torch

import bench.serving_step_split as split
from pypto_rt.kernels import attention
from pypto_rt.kernels.moe.layer import MoELayer
from pypto_rt.language.decorators import KernelFunction
import pypto_rt.serving.model.decoder as decoder
from pypto_rt.serving.model.one_token_step import OneTokenStep


def test_the_probe_restores_what_it_wraps(monkeypatch):
    monkeypatch.setattr(split, "STEPS", 4)
    monkeypatch.setattr(split, "ROUNDS", 2)
    before = ([getattr(decoder, name) for name in split.PARTS], attention.paged_decode_attention,
              MoELayer.__call__, MoELayer.after_out_proj, OneTokenStep.run, KernelFunction.__call__)
    threads = torch.get_num_threads()
    try:
        report = split.run(1)
        per_stage = split.run(1, one_token=False)
    finally:
        torch.set_num_threads(threads)
    after = ([getattr(decoder, name) for name in split.PARTS], attention.paged_decode_attention,
             MoELayer.__call__, MoELayer.after_out_proj, OneTokenStep.run, KernelFunction.__call__)
    assert after == before
    # (one token, two layers: the one-token kernels, L + 1 calls; per stage the layer's O projection, norm and
    # route are one kernel before the hit experts')
    assert "| layer one_token run | 1 |" in report and "| replay first_layer_kernel | 1 |" in report
    assert "| replay next_layer_kernel | 1 |" in report and "| replay head_kernel | 1 |" in report
    assert "| layer moe after_out_proj | 2 |" in per_stage and "| replay local_hit_kernel | 2 |" in per_stage
    assert "| replay out_proj_norm_route_kernel | 2 |" in per_stage
    assert "argument matching" in report and "argument matching" in per_stage
