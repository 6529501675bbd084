"""The compiled tier's graph inputs (replay.tier_graph): the replay's tensor constants go in as inputs, a boolean
mask as float32 compared with 0 inside the graph (inductor's C++ loads a bool mask lane by lane, slowly).

What users depend on: the traced function computes what the replay's body computes with its constants.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.tier_graph import tensor_constants, with_constants

BODY = """
def body(a0, a1):
    a1[:, :] = torch.where(keep, a0, fill) * scale
    return (a1,)
"""


def test_constants_are_graph_inputs_and_a_mask_goes_in_as_float_with_the_same_result():
    keep = torch.arange(8).view(1, 8) < 5
    constants = {"torch": torch, "keep": keep, "fill": torch.tensor(-1.0), "scale": 3}
    body = compile_trace(BODY, constants)
    names, inputs = tensor_constants(body)
    assert names == ["keep", "fill"] and inputs[0].dtype == torch.float32 and inputs[1].dtype == torch.float32
    x = torch.randn(4, 8)
    want, got = torch.empty(4, 8), torch.empty(4, 8)
    body(x, want)
    traced = make_fx(with_constants(body, names, 2))(x, torch.empty(4, 8), *inputs)
    assert sum(n.op == "placeholder" for n in traced.graph.nodes) == 4
    traced(x, got, *inputs)
    assert torch.equal(got, want) and torch.equal(want, torch.where(keep, x, -1.0) * 3)
