"""replay.tier_row_writes: several row windows of one input written in one compiled segment (the live MoE
dispatch's expansion) are written as row scatters, each a loop over its own rows, never one loop over the whole
input."""
from __future__ import annotations

import re

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pypto_rt.replay.tier_row_writes import scatter_row_windows
from tests.replay.test_tier_row_passes import traced_with_a_counted_size

aten = torch.ops.aten
ROWS, HIDDEN, LANES = 1000, 256, 300   # receive rows (3 experts' LANES rows and more), row length, arrival slots


def expand(out, tokens, sources, c0, c1, c2):
    """The live expansion as the tier traces it: per expert j, its first c_j receive rows gathered from the arrived
    tokens (the counts read from data before the segment: symbolic integers)."""
    for j, c in enumerate((c0, c1, c2)):
        picked = tokens.index_select(0, sources[j * LANES : j * LANES + c].reshape(-1).long())
        out[j * LANES : j * LANES + c].copy_(picked)
    return ()


def inputs():
    torch.manual_seed(0)
    return (torch.zeros(ROWS, HIDDEN, dtype=torch.bfloat16), torch.randn(LANES, HIDDEN).to(torch.bfloat16),
            torch.randint(0, LANES, (3 * LANES, 1), dtype=torch.int32))


def expected(counts):
    out, tokens, sources = inputs()
    expand(out, tokens, sources, *counts)
    return out


def test_the_windows_become_row_scatters_with_the_same_rows_for_every_count():
    graph = traced_with_a_counted_size(expand, inputs(), 40, 7, 120)
    assert scatter_row_windows(graph) == 3
    assert sum(n.target is aten.index_copy_.default for n in graph.graph.nodes) == 3
    assert not any(n.target is aten.copy_.default for n in graph.graph.nodes)
    for counts in ((40, 7, 120), (0, LANES, 1), (0, 0, 0)):
        out, tokens, sources = inputs()
        graph(out, tokens, sources, *counts)
        assert torch.equal(out, expected(counts)), counts


def test_one_window_or_windows_of_fixed_rows_are_left_to_the_compiler():
    def one(out, tokens):
        out[3:5].copy_(tokens[0:2])
        out[0:2].add_(1)   # (not a copy into a window)
        return ()
    assert scatter_row_windows(make_fx(one)(torch.zeros(8, 4), torch.ones(4, 4))) == 0
    tiles = make_fx(lambda out, tokens, sources: expand(out, tokens, sources, 40, 7, 120))(*inputs())
    assert scatter_row_windows(tiles) == 0   # (a tile loop's windows: inductor's, and join_tiles')


def test_the_compiled_writes_loop_over_their_own_rows_only():
    from torch._inductor.utils import run_and_get_code

    from pypto_rt.replay.tier_inductor import build

    counts = (40, 0, 120)
    out, tokens, sources = inputs()
    (compiled, _, _, rewritten), code = run_and_get_code(
        lambda: build(expand, [out, tokens, sources], counts, 1, scatter_row_windows, changes={"fx_graph_cache": False}))
    compiled(out, tokens, sources, *counts)
    assert rewritten == 3
    # unrewritten, inductor chains the windows' slice scatters into one loop over all ROWS rows (a masked branch a
    # window): the whole input read and written each call
    assert str(ROWS) not in re.findall(r"x\d+<static_cast<int64_t>\((\d+)L\)", "\n".join(code))
    assert torch.equal(out, expected(counts))
