"""Graph passes the compiled tier's tests run in the compile process (replay.tier.JOIN_PASSES names one as
`module:function`; the child imports this module by the test process's import path)."""
from __future__ import annotations

import time

import torch


def spoiling(graph) -> int:
    """As if joining K steps reordered a sum past the tolerance: every add becomes a subtraction."""
    adds = [n for n in graph.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    for node in adds:
        node.target = torch.ops.aten.sub.Tensor
    graph.recompile()
    return len(adds)


def stall(graph) -> int:
    """A compile that does not end by itself (as inductor on a replay of thousands of torch calls)."""
    time.sleep(3600)
    return 0
