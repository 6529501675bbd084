"""The send staging (`dispatch_parts.stage_by_destination`, both forms), the route counting's exclusive prefix
(`dispatch_parts.exclusive_prefix`): blocked past PREFIX_BLOCK rows at prefill's token counts, one [n, n] triangle
below; both give the exact counts (the multi-rank dispatch tests run small token counts, so they exercise the
one-matmul form only), and the combine's sum of the rows that came back (`dispatch_parts.sum_returned`)."""
import pytest
import torch

import pypto.language as pl
from pypto_rt.kernels.moe.dispatch_parts import (PREFIX_BLOCK, exclusive_prefix, route_layout, route_rows,
                                                 stage_by_destination, sum_returned)


@pytest.mark.parametrize("rows", [8, PREFIX_BLOCK, 3 * PREFIX_BLOCK, PREFIX_BLOCK + 8])
def test_the_exclusive_prefix_counts_the_ones_above_each_row_exactly(rows):
    width = 5

    @pl.jit
    def prefix(m: pl.Tensor[[rows, width], pl.FP32], out: pl.Out[pl.Tensor[[rows, width], pl.FP32]]):
        for _ in pl.spmd(1, name_hint="prefix"):
            out[:, :] = exclusive_prefix(m, rows, width)
        return out

    gen = torch.Generator().manual_seed(rows)
    ones = (torch.rand(rows, width, generator=gen) < 0.4).float()
    out = torch.full((rows, width), -1.0)
    prefix(ones, out)
    assert torch.equal(out, torch.cumsum(ones, dim=0) - ones)



def _staging_kernel(live: bool, world, n_experts, top_k, tokens, t_max, hidden):
    """One rank's routing and send staging (`stage_by_destination`), the live form or the scatter of every pair."""
    e_local, lanes = n_experts // world, world * t_max

    @pl.jit
    def stage(x: pl.Tensor[[tokens, hidden], pl.FP32], topk_idx: pl.Tensor[[tokens, top_k], pl.INT32],
              topk_weights: pl.Tensor[[tokens, top_k], pl.FP32],
              route_pos: pl.InOut[pl.Tensor[[tokens, top_k], pl.FP32]],
              slots: pl.InOut[pl.Tensor[[tokens, world], pl.FP32]],
              members: pl.InOut[pl.Tensor[[tokens, world], pl.FP32]],
              count_row: pl.InOut[pl.Tensor[[1, n_experts + world], pl.INT32]],
              send_x: pl.InOut[pl.Tensor[[lanes + 1, hidden], pl.FP32]],
              send_meta: pl.InOut[pl.Tensor[[lanes + 1, 2 * top_k], pl.FP32]]):
        for _ in pl.spmd(1, name_hint="stage"):
            count_row[:, :] = route_layout(topk_idx, route_pos, slots, members, tokens, n_experts, world, e_local,
                                           top_k)
            row_ids = route_rows(None, topk_idx, route_pos, tokens, n_experts, e_local, lanes)
            by_rank = pl.muls(pl.arange(0, [1, world], dtype=pl.INT32), t_max)
            send_x, send_meta = stage_by_destination(x, topk_idx, topk_weights, row_ids, slots, members, by_rank,
                                                     send_x, send_meta, tokens, world, e_local, top_k, lanes,
                                                     (count_row, t_max, n_experts) if live else None)
        return send_x, send_meta

    return stage


def test_the_live_staging_copies_each_destinations_tokens_once_and_touches_no_other_row():
    """The live form (one gather per destination of the rows it takes) stages the same rows and meta rows as the
    scatter of every (token, rank) pair, and writes nothing past a destination's tokens nor the spill row (the
    scatter drops its dead pairs there); a destination no token goes to gets no row."""
    world, n_experts, top_k, tokens, t_max, hidden = 4, 8, 3, 6, 8, 16
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, hidden, generator=gen)
    # no route to rank 3's experts (6, 7); distinct experts per token
    topk_idx = torch.stack([torch.randperm(6, generator=gen)[:top_k] for _ in range(tokens)]).int()
    topk_weights = torch.rand(tokens, top_k, generator=gen)
    staged = {}
    for live in (False, True):
        send_x = torch.full((world * t_max + 1, hidden), 7.0)
        send_meta = torch.zeros(world * t_max + 1, 2 * top_k)
        count_row = torch.zeros(1, n_experts + world, dtype=torch.int32)
        scratch = [torch.zeros(tokens, top_k), torch.zeros(tokens, world), torch.zeros(tokens, world)]
        _staging_kernel(live, world, n_experts, top_k, tokens, t_max, hidden)(
            x, topk_idx, topk_weights, *scratch, count_row, send_x, send_meta)
        staged[live] = (send_x, send_meta, count_row)
    counts = staged[True][2][0, n_experts:].tolist()
    assert counts[3] == 0 and torch.equal(staged[True][2], staged[False][2])
    for d in range(world):
        goes = [t for t in range(tokens) if any(int(e) // (n_experts // world) == d for e in topk_idx[t])]
        block = slice(d * t_max, d * t_max + len(goes))
        assert counts[d] == len(goes)
        for live in (False, True):
            assert torch.equal(staged[live][0][block], x[goes]) and torch.equal(staged[live][1][block],
                                                                                staged[False][1][block])
        assert bool((staged[True][0][d * t_max + len(goes) : (d + 1) * t_max] == 7.0).all())
    assert bool((staged[True][0][-1] == 7.0).all()) and not bool((staged[False][0][-1] == 7.0).all())


def test_the_sum_of_returned_rows_reads_each_tokens_live_ranks_and_the_zero_row_only():
    """Per token, the rows its ranks sent back (rank d's block from d * T_MAX, at the token's slot), summed; a rank
    the token has no route on reads the zero row. Every other row of the table is NaN (windows are never cleared:
    stale rows may hold anything), so one read of a row the token does not own, weighed 0 or not, makes it NaN.
    The first call runs on the engine, the later ones replay (recorded torch calls)."""
    world, t_max, tokens, hidden = 4, 4, 3, 8
    lanes = world * t_max

    @pl.jit
    def reduce(back: pl.Tensor[[lanes + 1, hidden], pl.FP32], slots: pl.Tensor[[tokens, world], pl.FP32],
               members: pl.Tensor[[tokens, world], pl.FP32], out: pl.Out[pl.Tensor[[tokens, hidden], pl.FP32]]):
        for _ in pl.spmd(1, name_hint="reduce"):
            by_rank = pl.muls(pl.arange(0, [1, world], dtype=pl.INT32), t_max)
            out[:, :] = sum_returned(back, slots, members, by_rank, lanes, tokens, hidden, world)
        return out

    gen = torch.Generator().manual_seed(5)
    members = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]], dtype=torch.float32)
    slots = torch.tensor([[1, 3, 1, 2], [2, 0, 0, 0], [2, 2, 0, 3]], dtype=torch.float32)   # row 0 is no live row
    back = torch.full((lanes + 1, hidden), float("nan"))
    back[lanes] = 0.0
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for d in range(world):
            if members[t, d]:
                row = d * t_max + int(slots[t, d])
                back[row] = torch.randn(hidden, generator=gen)
                want[t] += back[row]
    for _ in range(4):
        out = torch.full((tokens, hidden), -1.0)
        reduce(back, slots, members, out)
        assert torch.allclose(out, want), (out, want)
