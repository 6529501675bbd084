"""Embedding lookup: out [T, H] = table[ids] (one row gather per block of token rows)."""
import functools

import torch

import pypto.language as pl
from pypto_rt.kernels.layers.common import PL_DTYPES, ROW_TILE, check, check_float, describe

T_DYN = pl.dynamic("T_DYN")


@functools.lru_cache(maxsize=None)
def embedding_kernel(vocab: int, hidden: int, dtype: torch.dtype):
    dt = PL_DTYPES[dtype]

    @pl.jit
    def embedding_lookup(
        ids: pl.Tensor[[T_DYN, 1], pl.INT64],
        table: pl.Tensor[[vocab, hidden], dt],
        out: pl.Out[pl.Tensor[[T_DYN, hidden], dt]],
    ):
        ids.bind_dynamic(0, T_DYN)
        out.bind_dynamic(0, T_DYN)
        t_dim = pl.tensor.dim(ids, 0)
        for tb in pl.spmd((t_dim + ROW_TILE - 1) // ROW_TILE, name_hint="embedding"):
            t0 = tb * ROW_TILE
            valid = pl.min(ROW_TILE, t_dim - t0)
            out[t0 : t0 + valid, :] = pl.mgather(table, ids[t0 : t0 + valid, :], coalesce="row")
        return out

    return embedding_lookup


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows of table [V, H] for token ids [T] (int64 or int32, each in 0..V-1) -> [T, H] in table's dtype."""
    check_float("embedding", "table", table, 2)
    check(isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.dtype in (torch.int64, torch.int32),
          "embedding", lambda: f"ids must be a 1-D int64 tensor of token ids, got {describe(ids)}")
    out = torch.empty(ids.shape[0], table.shape[1], dtype=table.dtype)
    if ids.shape[0]:
        embedding_kernel(table.shape[0], table.shape[1], table.dtype)(
            ids.to(torch.int64).contiguous().view(-1, 1), table.contiguous(), out)
    return out
