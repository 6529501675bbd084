"""Index ops replay with indices that change every call: their bounds are checked by the replay itself
(torch._assert_async while recording, no read into Python), and a scatter's last-write-wins keeps static shapes."""
import pytest
import torch

import pypto.language as pl
from pypto_rt import config, run_stats
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED

ROWS, H, N = 16, 8, 6
CALLS = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 2


@pl.jit
def gather_scatter(x: pl.Tensor[[ROWS, H], pl.FP32], idx: pl.Tensor[[N, 1], pl.INT32],
                   dst: pl.Tensor[[N, 1], pl.INT32], table: pl.InOut[pl.Tensor[[ROWS, H], pl.FP32]],
                   picked: pl.Out[pl.Tensor[[N, H], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="index_ops"):
        rows = pl.mgather(x, idx, coalesce="row")
        picked[:, :] = rows
        table = pl.scatter_update(table, 0, dst, pl.mul(rows, 2.0))
    return picked


def _golden(x, idx, dst, table):
    rows = x[idx[:, 0].long()]
    for i, d in enumerate(dst[:, 0].tolist()):   # in index order: the last write to a row wins
        table[d] = rows[i] * 2
    return rows


def test_gathers_and_scatters_with_changing_indices_replay():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(ROWS, H, generator=gen)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(CALLS):
            idx = torch.randint(0, ROWS, (N, 1), generator=gen, dtype=torch.int32)
            dst = torch.randint(0, 4, (N, 1), generator=gen, dtype=torch.int32)   # duplicates on purpose
            table, want_table = torch.zeros(ROWS, H), torch.zeros(ROWS, H)
            picked = torch.zeros(N, H)
            with run_stats.collect() as stats:
                gather_scatter(x, idx, dst, table, picked)
            assert torch.equal(picked, _golden(x, idx, dst, want_table))
            assert torch.equal(table, want_table)
    assert stats.replay.kind == REPLAYED, stats.replay
    assert "called as they are" not in stats.replay.reason, stats.replay   # the block's torch calls replay


def test_an_index_out_of_range_fails_in_a_replay_too():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(ROWS, H, generator=gen)
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        for _ in range(CALLS):
            idx = torch.randint(0, ROWS, (N, 1), generator=gen, dtype=torch.int32)
            with run_stats.collect() as stats:
                gather_scatter(x, idx, torch.zeros(N, 1, dtype=torch.int32), torch.zeros(ROWS, H), torch.zeros(N, H))
        assert stats.replay.kind == REPLAYED, stats.replay
        idx[2, 0] = ROWS
        with pytest.raises(RuntimeError, match=r"pl.mgather: an index is outside the 16 gatherable entries"):
            gather_scatter(x, idx, torch.zeros(N, 1, dtype=torch.int32), torch.zeros(ROWS, H), torch.zeros(N, H))
