"""A pass over the compiled tier's traced graph: several row windows of one graph input written, each as a row
scatter.

A replay that writes `x[a:a + c] = v` once traces to `copy_(slice(x, 0, a, a + c), v)`, which inductor writes in
place over the c rows. Several such writes into one input (the live dispatch's expansion: one gather into each
expert's first rows, their counts read from data before the segment) become a chain of slice scatters that
inductor lowers as one loop over every row of `x`, a masked branch per window: at 8-rank decode T=128 the 64 MiB
of receive rows read and written whole each call (18 ms of CPU a call against 6). Written as
`index_copy_(x, 0, arange(a, a + c), v)` each write is its own loop over its c rows, the value fused into it
(bit for bit the same rows; the writes keep their order). Only inputs with a window of data-sized rows (a bound
traced as a symbol) are rewritten: windows of fixed rows (a tile loop's) are left to inductor and to
replay.tier_passes' joins.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

MIN_WRITES = 2   # one window written alone is already a write in place


def scatter_row_windows(graph: torch.fx.GraphModule) -> int:
    """Rewrite the row-window writes `copy_(slice(x, 0, a, b), v)` of each graph input `x` written through
    MIN_WRITES or more of them (v of the window's shape, step 1), one at least with a symbolic bound, as
    `index_copy_(x, 0, arange(a, b), v)`. Returns how many were rewritten (the graph is recompiled when any was)."""
    by_input: dict = {}
    for node in graph.graph.nodes:
        window = _row_window(node)
        if window is not None:
            by_input.setdefault(window.args[0], []).append(node)
    rewritten = 0
    for writes in by_input.values():
        if len(writes) < MIN_WRITES or all(type(b) is int for node in writes for b in node.args[0].args[2:4]):
            continue
        for node in writes:
            window, value = node.args
            base, _, start, end = window.args[:4]
            with graph.graph.inserting_before(node):
                rows = graph.graph.call_function(aten.arange.start, (start, end),
                                                 {"dtype": torch.int64, "device": _val(base).device})
                made = graph.graph.call_function(aten.index_copy_.default, (base, 0, rows, value))
            made.meta["val"] = _val(base)
            if node.users:   # (a traced write's result is unused; a use would want the window)
                with graph.graph.inserting_after(made):
                    again = graph.graph.call_function(aten.slice.Tensor, (made, 0, start, end))
                again.meta["val"] = _val(node)
                node.replace_all_uses_with(again)
            graph.graph.erase_node(node)
            if not window.users:
                graph.graph.erase_node(window)
            rewritten += 1
    if rewritten:
        graph.graph.lint()
        graph.recompile()
    return rewritten


def _row_window(node):
    """The `slice(x, 0, a, b)` node that `node` = copy_(it, v) writes, x a graph input and v of its shape; else
    None."""
    if node.op != "call_function" or node.target is not aten.copy_.default or node.kwargs or len(node.args) != 2:
        return None
    window, value = node.args
    if not (isinstance(window, torch.fx.Node) and window.op == "call_function"
            and window.target is aten.slice.Tensor and not window.kwargs and len(window.args) in (4, 5)):
        return None
    base, dim, start, end = window.args[:4]
    step = window.args[4] if len(window.args) == 5 else 1
    if not (isinstance(base, torch.fx.Node) and base.op == "placeholder") or dim != 0 or step != 1:
        return None
    rows = _val(base).shape[0] if isinstance(_val(base), torch.Tensor) else None
    for bound in (start, end):   # a plain row range: no open or negative bound
        if not (isinstance(bound, torch.fx.Node) or (type(bound) is int and type(rows) is int and 0 <= bound <= rows)):
            return None
    want, got = _val(window), _val(value)
    if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and want.dim() >= 1
            and got.dtype == want.dtype and got.dim() == want.dim() and _same_shape(got.shape, want.shape)):
        return None
    return window


def _same_shape(a, b) -> bool:
    """Whether two shapes (sizes may be symbols) are the same expressions."""
    return len(a) == len(b) and all(str(x) == str(y) for x, y in zip(a, b))


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None
