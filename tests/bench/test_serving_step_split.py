"""bench.serving_step_split's probe puts back what it wraps (the decoder's layer functions, the attention call, the
MoE layer's and every kernel's entry) and reports each part of the batch-1 step, the kernels' and their replays."""
import torch

import bench.serving_step_split as split
from pypto_rt.kernels import attention
from pypto_rt.kernels.moe.layer import MoELayer
from pypto_rt.language.decorators import KernelFunction
import pypto_rt.serving.model.decoder as decoder


def test_the_probe_restores_what_it_wraps(monkeypatch):
    monkeypatch.setattr(split, "STEPS", 4)
    monkeypatch.setattr(split, "ROUNDS", 2)
    before = ([getattr(decoder, name) for name in split.PARTS], attention.paged_decode_attention,
              MoELayer.__call__, MoELayer.after_out_proj, KernelFunction.__call__)
    threads = torch.get_num_threads()
    try:
        report = split.run(1)
    finally:
        torch.set_num_threads(threads)
    after = ([getattr(decoder, name) for name in split.PARTS], attention.paged_decode_attention,
             MoELayer.__call__, MoELayer.after_out_proj, KernelFunction.__call__)
    assert after == before
    # (one token: the layer's O projection, norm and route are one kernel before the hit experts')
    assert "| layer moe after_out_proj | 2 |" in report and "| replay local_hit_kernel | 2 |" in report
    assert "| replay out_proj_norm_route_kernel | 2 |" in report
    assert "argument matching" in report
