"""The route counting's exclusive prefix (`dispatch_parts.exclusive_prefix`): blocked past PREFIX_BLOCK rows at
prefill's token counts, one [n, n] triangle below; both give the exact counts (the multi-rank dispatch tests run
small token counts, so they exercise the one-matmul form only)."""
import pytest
import torch

import pypto.language as pl
from pypto_rt.kernels.moe.dispatch_parts import PREFIX_BLOCK, exclusive_prefix


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

