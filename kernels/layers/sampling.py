"""Greedy sampling: the id of each row's largest logit, the lowest id on ties."""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import PL_DTYPES, ROW_TILE, check_float

B_DYN = pl.dynamic("B_DYN")


@functools.lru_cache(maxsize=None)
def greedy_kernel(vocab: int, dtype: torch.dtype):
    dt = PL_DTYPES[dtype]

    @pl.jit
    def greedy_sample(
        logits: pl.Tensor[[B_DYN, vocab], dt],
        tokens: pl.Out[pl.Tensor[[B_DYN, 1], pl.INT64]],
    ):
        logits.bind_dynamic(0, B_DYN)
        tokens.bind_dynamic(0, B_DYN)
        b_dim = pl.tensor.dim(logits, 0)
        for bb in pl.spmd((b_dim + ROW_TILE - 1) // ROW_TILE, name_hint="greedy_sample"):
            b0 = bb * ROW_TILE
            valid = pl.min(ROW_TILE, b_dim - b0)
            tokens[b0 : b0 + valid, :] = pl.cast(pl.row_argmax(logits[b0 : b0 + valid, :]), target_type=pl.INT64)
        return tokens

    return greedy_sample


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> [B] int64: argmax per row, the lowest id among equal maxima."""
    check_float("greedy", "logits", logits, 2)
    tokens = torch.empty(logits.shape[0], 1, dtype=torch.int64)
    if logits.shape[0]:
        greedy_kernel(logits.shape[1], logits.dtype)(logits.contiguous(), tokens)
    return tokens.view(-1)
