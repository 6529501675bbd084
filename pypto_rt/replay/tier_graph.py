"""The compiled tier's graph call: inductor's generated code called as directly as the traced graph allows.

`compile_fx` wraps the code it generates in layers made for torch.compile's callers: dynamo's disable wrapper,
AOT autograd's runtime wrapper (parameters prepended, input mutations applied after the call, outputs that alias
inputs regenerated, version counters bumped) and the compiled graph's own `__call__` (profiler and autotuning
bookkeeping): ~9 µs a call on this CPU, a large part of a small kernel's golden. A replay's body needs none of
them where AOT kept the traced graph's calling convention: no parameter, every input mutation written inside the
graph (an inference graph keeps them there), no input deduplicated or merged into a synthetic base, no output
added. That is checked on the graph AOT gave inductor: its inputs and outputs one to one with the traced graph's.
Where it holds, the tier calls inductor's `call(inputs)` itself; else the wrapped function. Either way the tier
checks its function against the replay before the swap, and falls back to the wrapped call if the direct one
disagrees.

Tensors the replay keeps as constants (masks, index tables computed when recording) are graph inputs after the
tensor arguments, passed on every call, rather than constants AOT would lift into parameters. A boolean one goes
in as float32 and is compared with 0 inside the graph (the same mask): inductor's C++ loads a bool mask lane by
lane (c01's fillpad `where`: 158 µs against 68 µs with the float compare, measured on this CPU).
"""
from __future__ import annotations

import types

import torch


def tensor_constants(body) -> tuple[list[str], list[torch.Tensor]]:
    """(names, graph inputs): the tensors the body reads as globals (the replay's constants), booleans as float32
    (see the module text)."""
    names = [n for n in body.__code__.co_names if type(body.__globals__.get(n)) is torch.Tensor]
    tensors = [body.__globals__[n] for n in names]
    return names, [t.float() if t.dtype is torch.bool else t for t in tensors]


def with_constants(body, names: list[str], tensors: int):
    """`body` as a function of its `tensors` tensor arguments, then the constants `names`, then its other
    parameters (the carried values): what is traced, so the constants enter the graph as inputs."""
    if not names:
        return body
    count = len(names)
    flags = [body.__globals__[n].dtype is torch.bool for n in names]   # (given as float32: the mask again)

    def traced(*inputs):
        own = dict(body.__globals__)
        given = inputs[tensors:tensors + count]
        own.update((n, t.ne(0) if flag else t) for n, t, flag in zip(names, given, flags))
        return types.FunctionType(body.__code__, own)(*inputs[:tensors], *inputs[tensors + count:])
    return traced


def capturing(found: list):
    """An `inner_compile` for `compile_fx` that notes each (graph AOT made, inductor's compiled code) in `found`."""
    from torch._inductor.compile_fx import compile_fx_inner

    def inner_compile(graph, example_inputs, *args, **kwargs):
        compiled = compile_fx_inner(graph, example_inputs, *args, **kwargs)
        found.append((graph, compiled))
        return compiled
    return inner_compile


def direct_call(traced: torch.fx.GraphModule, found: list):
    """`(list of inputs) -> outputs`: inductor's own `call` (it empties the list), or None where AOT changed the
    traced graph's inputs or outputs (see the module text)."""
    if len(found) != 1:
        return None
    graph, compiled = found[0]
    if _signature(graph) != _signature(traced) or getattr(compiled, "current_callable", None) is None:
        return None
    return lambda inputs: compiled.current_callable(inputs)   # (read per call: inductor may replace it)


def _signature(graph: torch.fx.GraphModule) -> tuple[int, int]:
    """(inputs, outputs) of a graph."""
    inputs = sum(node.op == "placeholder" for node in graph.graph.nodes)
    returned = graph.graph.output_node().args[0]
    return inputs, len(returned) if isinstance(returned, (tuple, list)) else 1
