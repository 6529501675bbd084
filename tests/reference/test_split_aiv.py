"""`pl.split_aiv` lanes: every lane runs the body in turn (aiv_id 0, 1); in a data-parallel region (UP_DOWN /
LEFT_RIGHT) `pl.aiv_shard` of a cube tile is the lane's half of its rows / columns, as the real compiler halves the
vector side of the region (the public kernel library's lm_head pushes each lane's rows by aiv_id); in a
task-parallel one (NONE) the whole tile. A vector -> cube `pl.aic_gather` in a data-parallel region is refused."""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
from pypto_rt.errors import NotSupportedError

ROWS, COLS = 4, 6


def _lanes_kernel(mode):
    @pl.jit
    def lanes(a: pl.Tensor[[ROWS, 8], pl.FP32], b: pl.Tensor[[COLS, 8], pl.FP32],
              out: pl.Out[pl.Tensor[[2 * ROWS, COLS], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="lanes"):
            acc = pl.matmul(a, b, b_trans=True, out_dtype=pl.FP32)
            for aiv_id in pl.split_aiv(2, mode=mode):
                shard = pl.aiv_shard(acc)
                if mode == pl.SplitMode.NONE:
                    out[aiv_id * ROWS : (aiv_id + 1) * ROWS, :] = shard
                elif mode == pl.SplitMode.UP_DOWN:
                    out[aiv_id * ROWS // 2 : (aiv_id + 1) * ROWS // 2, :] = shard
                else:
                    out[aiv_id * ROWS : (aiv_id + 1) * ROWS, 0 : COLS // 2] = shard
        return out

    return lanes


@pytest.mark.parametrize("mode", [pl.SplitMode.NONE, pl.SplitMode.UP_DOWN, pl.SplitMode.LEFT_RIGHT],
                         ids=["none", "up-down", "left-right"])
def test_each_lane_runs_and_holds_its_part_of_a_cube_tile(mode):
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(ROWS, 8, generator=gen), torch.randn(COLS, 8, generator=gen)
    full = a @ b.T
    out = torch.zeros(2 * ROWS, COLS)
    _lanes_kernel(mode)(a, b, out)
    if mode == pl.SplitMode.NONE:
        expected = torch.cat([full, full])
    elif mode == pl.SplitMode.UP_DOWN:
        expected = torch.cat([full, torch.zeros(ROWS, COLS)])
    else:
        expected = torch.zeros(2 * ROWS, COLS)
        expected[:ROWS, : COLS // 2], expected[ROWS:, : COLS // 2] = full[:, : COLS // 2], full[:, COLS // 2 :]
    torch.testing.assert_close(out, expected)


def test_a_vector_to_cube_gather_in_a_data_parallel_region_is_refused():
    @pl.jit
    def gathers(a: pl.Tensor[[ROWS, 8], pl.FP32], out: pl.Out[pl.Tensor[[ROWS, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="gathers"):
            for aiv_id in pl.split_aiv(2, mode=pl.SplitMode.UP_DOWN):
                out[:, :] = pl.aic_gather(pl.aiv_shard(a))
        return out

    with pytest.raises(NotSupportedError, match="aic_gather"):
        gathers(torch.ones(ROWS, 8), torch.zeros(ROWS, 8))
