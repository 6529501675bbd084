"""The engine counts the elements of data a host program reads (`pl.read` / `x[i, j]` outside InCore regions):
PYPTO_STATS prints them and `run_stats.collect()` returns them; reads inside a region are the kernel's own."""
import torch

import pypto.language as pl
from pypto_rt import config, run_stats

N = 8


@pl.jit
def host_reads_lengths(lengths: pl.Tensor[[4], pl.INT32], x: pl.Tensor[[4, N], pl.FP32],
                       out: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    for b in pl.range(4):
        n = pl.read(lengths, [b])       # on the host: the loop below depends on it
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale_row"):
            out[b : b + 1, :] = pl.mul(x[b : b + 1, :], pl.cast(n, pl.FP32))
    return out


@pl.jit
def kernel_reads_lengths(lengths: pl.Tensor[[4], pl.INT32], x: pl.Tensor[[4, N], pl.FP32],
                         out: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale_rows"):
        for b in pl.range(4):
            n = pl.read(lengths, [b])   # inside the region: the kernel reads it, not the host
            out[b : b + 1, :] = pl.mul(x[b : b + 1, :], pl.cast(n, pl.FP32))
    return out


def _host_reads(kernel, capsys) -> int:
    lengths = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    x, out = torch.randn(4, N), torch.zeros(4, N)
    with config.scope(REPLAY="0", STATS="1"), run_stats.collect() as stats:
        kernel(lengths, x, out)
    assert torch.allclose(out, x * lengths.view(4, 1).float())
    printed = capsys.readouterr().err
    assert f"host reads {stats.host_reads}" in printed, printed
    return stats.host_reads


def test_reads_on_the_host_are_counted(capsys):
    assert _host_reads(host_reads_lengths, capsys) == 4


def test_reads_inside_a_region_are_not_host_reads(capsys):
    assert _host_reads(kernel_reads_lengths, capsys) == 0
