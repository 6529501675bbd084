"""Passes over the compiled tier's traced graph for gathered rows (replay.tier_passes): the op library's word views
undone, narrow batched products unrolled with each term gathering its rows (a widening cast made before the select).

What users depend on: the rewritten graph gives the values the traced one gives (bit for bit for the first, the sum
within float reordering for the second), a +inf row behind a dead slot still sums to +inf and a NaN row nobody
owns stays out of the sum, and only the patterns named are rewritten.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pypto_rt.ops.comparison import _sels_half
from pypto_rt.ops.gather import _rows_at
from pypto_rt.ops.value import TensorValue
from pypto_rt.replay.tier_passes import drop_word_views, rewrite, unroll_narrow_products

aten = torch.ops.aten
ROWS, HIDDEN, LANES, WIDTH = 12, 128, 5, 3


def count(graph, target) -> int:
    return sum(node.target is target for node in graph.graph.nodes)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def gathered_selected(table, positions, live):
    """The op library's row gather and select of 2-byte rows, as the replay records them: on 4-byte words."""
    rows = _rows_at(table, positions)
    return (_sels_half(live, TensorValue(rows, None), 0.0).data,)


def inputs():
    table = torch.randn(ROWS, HIDDEN).to(torch.bfloat16)
    table[3] = float("nan")   # a row nobody owns: the select keeps it out
    table[5] = float("inf")
    positions = torch.tensor([0, 3, 5, 7, 3, 11, 2, 9])
    live = torch.tensor([True, False, True, True, False, True, True, True]).reshape(-1, 1)
    return table, positions, live


def test_the_word_views_of_a_row_gather_and_select_are_undone_bit_for_bit():
    table, positions, live = inputs()
    graph = make_fx(gathered_selected)(table, positions, live)
    assert count(graph, aten.view.dtype) >= 4
    assert drop_word_views(graph) == 2
    row_views = [n for n in graph.graph.nodes if n.target is aten.view.dtype and n.meta.get("val") is not None
                 and n.meta["val"].dim() == 2]
    assert row_views == []   # (left: views of the select's 0-d fill word, as the op library builds it)
    assert torch.equal(bits(graph(table, positions, live)[0]), bits(gathered_selected(table, positions, live)[0]))


def test_a_word_select_masked_along_the_row_is_left_alone():
    def per_word(data, mask, word):
        return (torch.where(mask, data.view(torch.int32), word).view(torch.bfloat16),)
    data = torch.randn(4, 8).to(torch.bfloat16)
    mask, word = torch.rand(4, 4) > 0.5, torch.tensor(0, dtype=torch.int32)
    graph = make_fx(per_word)(data, mask, word)
    assert drop_word_views(graph) == 0   # (its mask splits word pairs: a select of halves would differ)


def scattered(out, targets, part):
    """The op library's row scatter of 2-byte rows (ops.mscatter), as the replay records it: on 4-byte words."""
    values = part.to(torch.bfloat16)
    out.view(torch.float32).index_copy_(0, targets, values.view(torch.float32))
    return (out,)


def test_the_word_views_of_a_row_scatter_are_undone_bit_for_bit():
    out = torch.randn(ROWS, HIDDEN).to(torch.bfloat16)
    out[4] = float("nan")   # rows the scatter does not write keep their bits
    targets, part = torch.tensor([1, 3, 7]), torch.randn(3, HIDDEN)
    part[1] = float("inf")
    graph = make_fx(scattered)(out.clone(), targets, part)
    assert drop_word_views(graph) == 1
    assert count(graph, aten.view.dtype) == 0 and count(graph, aten.index_copy_.default) == 1
    got, want = out.clone(), out.clone()
    graph(got, targets, part)
    scattered(want, targets, part)
    assert torch.equal(bits(got), bits(want))


def test_a_word_scatter_along_the_row_is_left_alone():
    def along_row(out, targets, values):
        out.view(torch.float32).index_copy_(1, targets, values.view(torch.float32))
        return (out,)
    graph = make_fx(along_row)(torch.zeros(4, 8, dtype=torch.bfloat16), torch.tensor([0, 2]),
                               torch.ones(4, 4, dtype=torch.bfloat16))
    assert drop_word_views(graph) == 0   # (a column of words is a pair of 2-byte columns: left as it is)


def weighted_rows(table, slots, weights):
    """The MoE combine's fixed form as recorded: a stand-in row for each dead slot (-1), one gather of every slot's
    row selected to 0 where dead, cast and summed with the slots' weights in one batched product."""
    live = slots >= 0
    fallback = slots.max(dim=1, keepdim=True).values.clamp(min=0).expand(LANES, WIDTH)
    positions = torch.where(live, slots, fallback).reshape(-1).long()
    picked = gathered_selected(table, positions, live.reshape(-1, 1))[0]
    product = torch.matmul(torch.where(live, weights, 0.0).reshape(LANES, 1, WIDTH),
                           picked.reshape(LANES, WIDTH, HIDDEN).float())
    return (product.reshape(LANES, HIDDEN).to(torch.bfloat16),)


def combine_inputs():
    table = torch.randn(ROWS, HIDDEN).to(torch.bfloat16)
    table[4] = float("inf")
    table[10] = float("nan")   # never a live slot's row
    slots = torch.tensor([[0, 4, -1], [-1, 2, 6], [7, -1, -1], [1, 8, 9], [4, -1, 3]], dtype=torch.int32)
    weights = torch.rand(LANES, WIDTH)
    return table, slots, weights


def test_a_narrow_product_of_gathered_rows_sums_terms_that_gather_their_own_rows():
    table, slots, weights = combine_inputs()
    graph = make_fx(weighted_rows)(table, slots, weights)
    want = weighted_rows(table, slots, weights)[0]
    assert rewrite(graph, join=False) == 1
    assert count(graph, aten.bmm.default) == 0
    assert count(graph, aten.index_select.default) == WIDTH   # (one per term: no whole gathered buffer)
    got = graph(table, slots, weights)[0]
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isinf(got[[0, 4]]).all() and not torch.isnan(got).any()   # +inf behind a live slot, no 0 * inf


def grouped_rows(table, slots, weights, lines):
    """The MoE combine's live form for one group: its first `lines` slots (a count the call computed, carried into
    the compiled graph as a symbolic integer: replay.late_rows), all live, one gather of their rows and one batched
    product."""
    slots, weights = slots[0:lines], weights[0:lines]
    picked = gathered_selected(table, slots.reshape(-1).long(), torch.ones(lines * WIDTH, 1, dtype=torch.bool))[0]
    product = torch.matmul(weights.reshape(lines, 1, WIDTH), picked.reshape(lines, WIDTH, HIDDEN).float())
    return (product.reshape(lines, HIDDEN).to(torch.bfloat16),)


def traced_with_a_counted_size(fn, tensors, *counts):
    """`fn` traced as the compiled tier traces a segment (replay.tier_inductor): tensors of static sizes, the
    integers symbolic (never specialised for 0 or 1)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake = FakeTensorMode(shape_env=ShapeEnv(specialize_zero_one=False, duck_shape=False), static_shapes=True,
                          allow_non_fake_inputs=True)
    with tracing(TracingContext(fake)):
        return make_fx(fn, tracing_mode="symbolic")(*tensors, *counts)


def test_a_narrow_product_over_a_counted_number_of_lines_is_unrolled_for_every_count():
    table = torch.randn(ROWS, HIDDEN).to(torch.bfloat16)
    slots, weights = torch.randint(0, ROWS, (LANES, WIDTH), dtype=torch.int32), torch.rand(LANES, WIDTH)
    graph = traced_with_a_counted_size(grouped_rows, (table, slots, weights), 3)
    product = next(n for n in graph.graph.nodes if n.target is aten.bmm.default)
    assert not isinstance(product.meta["val"].shape[0], int)   # (the lines are a symbolic size)
    assert rewrite(graph, join=False) == 1
    assert count(graph, aten.bmm.default) == 0
    for lines in (3, 1, LANES):
        torch.testing.assert_close(graph(table, slots, weights, lines)[0],
                                   grouped_rows(table, slots, weights, lines)[0])


def test_wide_or_short_products_are_left_to_the_compiler():
    def products(a, b, c, d):
        return (torch.bmm(a, b), torch.bmm(c, d))
    wide = (torch.randn(2, 1, 32), torch.randn(2, 32, 128))    # 32 terms: a reduction
    short = (torch.randn(2, 1, 3), torch.randn(2, 3, 16))      # 16-element rows
    graph = make_fx(products)(*wide, *short)
    assert unroll_narrow_products(graph) == 0 and count(graph, aten.bmm.default) == 2


def test_without_reordering_only_the_exact_passes_run():
    table, slots, weights = combine_inputs()
    graph = make_fx(weighted_rows)(table, slots, weights)
    assert rewrite(graph, join=False, reorder=False) == 0
    assert count(graph, aten.bmm.default) == 1
    assert torch.equal(bits(graph(table, slots, weights)[0]), bits(weighted_rows(table, slots, weights)[0]))


def every_slot_sums(table, slots, meta, zero, fill, sums):
    """The MoE combine's sums over every route slot at top-8 as the tier traces its segment (kernels.moe.dispatch,
    `weighted_all`): the live test against a 0-d input, the weights after the rows in `meta`, a stand-in row for
    dead slots, the gather's bounds assert, the rounded rows written into the sums' first lines."""
    lanes, width = slots.shape
    routes = slots.long()
    live = routes >= zero
    weights = torch.where(live, meta[:, width : 2 * width], fill)
    stand_in = torch.maximum(routes.max(dim=1, keepdim=True).values, zero).expand(lanes, width)
    positions = torch.where(live, routes, stand_in).reshape(-1) & 0xFFFFFFFF
    torch._assert_async((positions < table.shape[0]).all(), "an index is outside the table")
    picked = torch.where(live.reshape(-1, 1), table.index_select(0, positions).float(), 0.0)
    product = torch.bmm(weights.reshape(lanes, 1, width), picked.reshape(lanes, width, table.shape[1]))
    sums[0:lanes].copy_(product.reshape(lanes, table.shape[1]).to(torch.bfloat16))
    return ()


def test_an_unrolled_top8_sum_compiles_to_one_loop_writing_the_rounded_rows():
    from torch._inductor import config as inductor
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code

    from pypto_rt.replay.tier_inductor import inductor_settings, narrow_settings

    lanes, width, rows, hidden = 64, 8, 96, 256
    table = torch.randn(rows, hidden).to(torch.bfloat16)
    slots = torch.where(torch.rand(lanes, width) < 0.3, torch.randint(0, rows, (lanes, width)), -1).to(torch.int32)
    inputs = [table, slots, torch.rand(lanes, 2 * width), torch.tensor(0), torch.zeros(lanes, width),
              torch.zeros(lanes + 1, hidden, dtype=torch.bfloat16)]
    graph = make_fx(every_slot_sums)(*inputs)
    assert narrow_settings(graph) == {}   # (nothing unrolled yet: inductor's own settings)
    assert rewrite(graph, join=False) == 1
    with inductor.patch({**inductor_settings(1), "fx_graph_cache": False, **narrow_settings(graph)}):
        _, code = run_and_get_code(lambda: compile_fx(graph, inputs)(*inputs))
    # the FP32 sums are never stored whole: at inductor's default thresholds the 8-term sum is cut into pieces and
    # its [lanes, 1, hidden] FP32 value written out before a second loop rounds it (3x the time at 8-rank prefill)
    assert not [line for line in code[0].splitlines() if "empty_strided" in line and "torch.float32" in line]
    want = torch.zeros_like(inputs[-1])
    every_slot_sums(*inputs[:-1], want)
    torch.testing.assert_close(inputs[-1], want)
