"""The decoder's last step in one kernel: each request's last token row, the final residual add and RMSNorm, the
LM head in FP32 and greedy sampling.

    tokens, logits = norm_head_greedy(hidden [T, H], residual [T, H], last [B], norm_weight [H], lm_head [V, H], eps)
    # rows = hidden[last] + residual[last] (rounded to the dtype), normed = rms_norm(rows),
    # logits = normed @ lm_head.T [B, V] FP32, tokens = argmax per row [B] int64 (the lowest id on ties)

The same values as embedding -> rms_norm(..., residual=) -> linear(out_dtype=FP32) -> greedy; residual is read, not
written.
"""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import (PL_DTYPES, ROW_TILE, cast_to, check, check_float, describe,
                                            matmul_bt_walked)
from pypto_rt.kernels.layers.norm import rms_normalizer

B_DYN = pl.dynamic("B_DYN")
T_DYN = pl.dynamic("T_DYN")


@functools.lru_cache(maxsize=None)
def head_kernel(vocab: int, hidden: int, dtype: torch.dtype, eps: float):
    dt, matmul_bt = PL_DTYPES[dtype], matmul_bt_walked(hidden)
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, eps)

    @pl.jit
    def norm_head_greedy(
        x: pl.Tensor[[T_DYN, hidden], dt],
        residual: pl.Tensor[[T_DYN, hidden], dt],
        last: pl.Tensor[[B_DYN, 1], pl.INT64],
        weight: pl.Tensor[[1, hidden], dt],
        lm_head: pl.Tensor[[vocab, hidden], dt],
        tokens: pl.Out[pl.Tensor[[B_DYN, 1], pl.INT64]],
        logits: pl.Out[pl.Tensor[[B_DYN, vocab], pl.FP32]],
    ):
        x.bind_dynamic(0, T_DYN)
        residual.bind_dynamic(0, T_DYN)
        last.bind_dynamic(0, B_DYN)
        tokens.bind_dynamic(0, B_DYN)
        logits.bind_dynamic(0, B_DYN)
        b_dim = pl.tensor.dim(last, 0)
        for bb in pl.spmd((b_dim + ROW_TILE - 1) // ROW_TILE, name_hint="norm_head_greedy"):
            b0 = bb * ROW_TILE
            valid = pl.min(ROW_TILE, b_dim - b0)
            rows = last[b0 : b0 + valid, :]
            summed = narrow(pl.add(widen(pl.mgather(x, rows, coalesce="row")),
                                   widen(pl.mgather(residual, rows, coalesce="row"))))
            normed = narrow(normalize(widen(summed), widen(weight)))
            acc = matmul_bt(normed, lm_head)
            logits[b0 : b0 + valid, :] = acc
            tokens[b0 : b0 + valid, :] = pl.cast(pl.row_argmax(acc), target_type=pl.INT64)
        return tokens, logits

    return norm_head_greedy


@functools.lru_cache(maxsize=None)
def head_rows_kernel(vocab: int, hidden: int, dtype: torch.dtype, eps: float):
    """head_kernel where every row is a request's last (a decode step: B = T): no row gather."""
    dt, matmul_bt = PL_DTYPES[dtype], matmul_bt_walked(hidden)
    widen, narrow, normalize = cast_to(dt, pl.FP32), cast_to(pl.FP32, dt), rms_normalizer(hidden, eps)

    @pl.jit
    def norm_head_greedy_rows(
        x: pl.Tensor[[B_DYN, hidden], dt],
        residual: pl.Tensor[[B_DYN, hidden], dt],
        weight: pl.Tensor[[1, hidden], dt],
        lm_head: pl.Tensor[[vocab, hidden], dt],
        tokens: pl.Out[pl.Tensor[[B_DYN, 1], pl.INT64]],
        logits: pl.Out[pl.Tensor[[B_DYN, vocab], pl.FP32]],
    ):
        for t in (x, residual, tokens, logits):
            t.bind_dynamic(0, B_DYN)
        b_dim = pl.tensor.dim(x, 0)
        for bb in pl.spmd((b_dim + ROW_TILE - 1) // ROW_TILE, name_hint="norm_head_greedy"):
            b0 = bb * ROW_TILE
            valid = pl.min(ROW_TILE, b_dim - b0)
            summed = narrow(pl.add(widen(x[b0 : b0 + valid, :]), widen(residual[b0 : b0 + valid, :])))
            normed = narrow(normalize(widen(summed), widen(weight)))
            acc = matmul_bt(normed, lm_head)
            logits[b0 : b0 + valid, :] = acc
            tokens[b0 : b0 + valid, :] = pl.cast(pl.row_argmax(acc), target_type=pl.INT64)
        return tokens, logits

    return norm_head_greedy_rows


def norm_head_greedy(hidden: torch.Tensor, residual: torch.Tensor, last: torch.Tensor, norm_weight: torch.Tensor,
                     lm_head: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B] int64, logits [B, V] FP32) of the rows `last` [B] (int64, each < T) of hidden + residual;
    last=None: every row (B = T, a decode step's rows are each its request's last)."""
    check_float("norm_head_greedy", "hidden", hidden, 2)
    (rows, width), dtype = hidden.shape, hidden.dtype
    check(isinstance(residual, torch.Tensor) and residual.shape == hidden.shape and residual.dtype == dtype,
          "norm_head_greedy", lambda: f"residual must be {dtype} {list(hidden.shape)} (hidden's shape), got "
          f"{describe(residual)}")
    check(last is None or isinstance(last, torch.Tensor) and last.dim() == 1 and
          last.dtype in (torch.int64, torch.int32), "norm_head_greedy",
          lambda: f"last must be None or a 1-D int64 tensor of row ids, got {describe(last)}")
    check(isinstance(norm_weight, torch.Tensor) and list(norm_weight.shape) == [width] and norm_weight.dtype == dtype,
          "norm_head_greedy", lambda: f"norm_weight must be {dtype} [{width}], got {describe(norm_weight)}")
    check(isinstance(lm_head, torch.Tensor) and lm_head.dim() == 2 and lm_head.shape[1] == width and
          lm_head.dtype == dtype, "norm_head_greedy", lambda: f"lm_head must be {dtype} [V, {width}], got "
          f"{describe(lm_head)}")
    batch, vocab = rows if last is None else last.shape[0], lm_head.shape[0]
    tokens = torch.empty(batch, 1, dtype=torch.int64)
    logits = torch.empty(batch, vocab, dtype=torch.float32)
    if last is None and rows:
        head_rows_kernel(vocab, width, dtype, float(eps))(hidden.contiguous(), residual.contiguous(),
                                                          norm_weight.view(1, width), lm_head.contiguous(), tokens,
                                                          logits)
    elif batch and rows:
        head_kernel(vocab, width, dtype, float(eps))(hidden.contiguous(), residual.contiguous(),
                                                     last.to(torch.int64).view(-1, 1), norm_weight.view(1, width),
                                                     lm_head.contiguous(), tokens, logits)
    return tokens.view(-1), logits
