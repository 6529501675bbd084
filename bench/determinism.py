"""Benchmark 7 - the cost of PYPTO_DETERMINISTIC=1 on split-K kernels (atomic adds into one output), mode on / off.

Two kernels: `split_k_blocks`, one pl.spmd task whose blocks each multiply one K slice and add it into C (the mode
keeps each block's adds and the last block applies them in block order), and `split_k_tasks`, one task per K slice
in a manual scope (the mode adds an edge from each task to the previous one, so the slices run one after another).
Each is timed on the engine (PYPTO_REPLAY=0: what every call whose course depends on data pays) and by default
(replays allowed), the mode off and on interleaved in one process. Every timed result is also checked: with the
mode on, bit for bit a one-worker run's.
"""
from __future__ import annotations

import torch

import pypto.language as pl
from bench.timing import interleaved, ms, ratio, table
from pypto_rt import config

TITLE = "7. Deterministic atomic adds (PYPTO_DETERMINISTIC=1): split-K, mode on / off"
M, K, N, SPLITS = 64, 8192, 256, 16
K_TILE = K // SPLITS


@pl.jit
def split_k_blocks(a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32],
                   c: pl.InOut[pl.Tensor[[M, N], pl.FP32]]):
    with pl.spmd(SPLITS, name_hint="split_k_block"):
        k = pl.get_block_idx()
        part = pl.matmul(a[:, k * K_TILE : (k + 1) * K_TILE], b[k * K_TILE : (k + 1) * K_TILE, :],
                         out_dtype=pl.FP32)
        c = pl.assemble(c, part, [0, 0], atomic=pl.AtomicType.Add)
    return c


@pl.jit
def split_k_tasks(a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32],
                  c: pl.InOut[pl.Tensor[[M, N], pl.FP32]]):
    with pl.manual_scope():
        for k in pl.range(SPLITS):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="split_k_task"):
                part = pl.matmul(a[:, k * K_TILE : (k + 1) * K_TILE], b[k * K_TILE : (k + 1) * K_TILE, :],
                                 out_dtype=pl.FP32)
                c = pl.assemble(c, part, [0, 0], atomic=pl.AtomicType.Add)
    return c


def _call(kernel, a, b, c, **knobs):
    def call():
        c.zero_()
        with config.scope(**knobs):
            kernel(a, b, c)
    return call


def _rows(kernel, a, b, repeats: int) -> list[list[str]]:
    one_worker = torch.zeros(M, N)
    _call(kernel, a, b, one_worker, NUM_WORKERS="1", REPLAY="0", KERNEL_REPLAY="0")()
    rows = []
    for way, knobs in (("engine (`PYPTO_REPLAY=0`)", {"REPLAY": "0"}), ("default", {})):
        c_off, c_on = torch.zeros(M, N), torch.zeros(M, N)
        times = interleaved({"off": _call(kernel, a, b, c_off, DETERMINISTIC="0", **knobs),
                             "on": _call(kernel, a, b, c_on, DETERMINISTIC="1", **knobs)}, repeats, warmup=3)
        same = "yes" if torch.equal(c_on, one_worker) else "**no**"
        rows.append([f"`{kernel.__name__}`, {way}", ms(times["off"]), ms(times["on"]),
                     ratio(times["on"] / times["off"]), same])
    return rows


def run(repeats: int = 15) -> str:
    torch.manual_seed(0)
    a, b = torch.randn(M, K), torch.randn(K, N)
    rows = _rows(split_k_blocks, a, b, repeats) + _rows(split_k_tasks, a, b, repeats)
    return "\n".join([
        table(["kernel, how it runs", "mode off", "mode on", "on / off", "on = one-worker run, bit for bit"], rows),
        "",
        f"C[{M}x{N}] += A[{M}x{K}] @ B[{K}x{N}] in {SPLITS} K slices of {K_TILE}, each added atomically into C; "
        f"median of {repeats} interleaved repeats, default workers. No target: the default (mode off) is unchanged."])


if __name__ == "__main__":
    print(run())
