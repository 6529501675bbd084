"""The compiled tier's inductor build (replay.tier_inductor): the generated code does not re-check its inputs'
sizes and strides on every call (the replay's guards matched them before any tier runs).

What users depend on: a compiled call computes what the traced function does, with as little per-call work as the
guards allow.
"""
from __future__ import annotations

import torch

from pypto_rt.replay import tier_inductor


def _body(a, b):
    b[:, :] = a * 2 + 1
    return (b,)


def test_the_direct_call_computes_the_body_without_size_asserts():
    x, got = torch.randn(4, 8), torch.empty(4, 8)
    compiled, direct, guards, _ = tier_inductor.build(_body, [x, torch.empty(4, 8)], (), 1, lambda graph: None)
    assert direct is not None and guards is None
    direct([x, got])
    assert torch.equal(got, x * 2 + 1)
    call = direct.__closure__[0].cell_contents.current_callable     # inductor's generated `call(args)`
    names = getattr(call, "__func__", call).__code__.co_names
    assert "assert_size_stride" not in names
