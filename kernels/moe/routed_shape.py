"""What a compiled routed-experts kernel depends on, and the inline that zeroes a tile's rows past a live count
(shared by the tile-loop form in experts.py and the decode forms in experts_decode.py)."""
from dataclasses import dataclass

import pypto.language as pl
from pypto_rt.kernels.moe.ffn import ROW_TILE, FfnShape


@dataclass(frozen=True)
class RoutedShape:
    ffn: FfnShape
    n_local: int
    rows: int
    split: int                  # spmd blocks per local expert (EXPERT_SPLIT)
    fixed_rows: int = 0         # > 0: a decode form over this many rows per expert (experts_decode.py)
    slots: int = 0              # > 0: the hit-experts form, this many blocks, one per expert with rows


def live_rows(hidden: int, dt, tile_rows: int = ROW_TILE):
    """An inline `(tile [tile_rows, hidden], n) -> the tile with its rows from n on zeroed` (whatever they held:
    NaN too). An integer compare and a select rather than a valid box, so the count stays data: a replay reads
    it again instead of pinning it."""

    @pl.jit.inline
    def live_rows(tile, n):
        row = pl.row_expand(pl.full([tile_rows, hidden], dtype=pl.INT32, value=0),
                            pl.reshape(pl.arange(0, [1, tile_rows], dtype=pl.INT32), [tile_rows, 1]))
        return pl.sel(pl.cmps(row, n, cmp_type=2), tile, pl.full([tile_rows, hidden], dtype=dt, value=0.0))

    return live_rows


def live_expert_rows(experts: int, rows: int, hidden: int, dt):
    """An inline `(x [experts, rows, hidden], counts [experts] INT32 tensor) -> x with expert e's rows from
    counts[e] on zeroed`: the counts broadcast against a row iota as one [experts * rows, 1] tile of rows left, so
    its torch calls do not grow with the experts and the counts stay data."""
    flat = experts * rows

    @pl.jit.inline
    def live_expert_rows(x, counts):
        limit = pl.row_expand(pl.full([experts, rows], dtype=pl.INT32, value=0),
                              pl.reshape(counts[0:experts], [experts, 1]))
        row = pl.col_expand(pl.full([experts, rows], dtype=pl.INT32, value=0),
                            pl.arange(0, [1, rows], dtype=pl.INT32))
        left = pl.reshape(pl.sub(limit, row), [flat, 1])
        live = pl.cmps(pl.row_expand(pl.full([flat, hidden], dtype=pl.INT32, value=0), left), 0, cmp_type=4)
        kept = pl.sel(live, pl.reshape(x, [flat, hidden]), pl.full([flat, hidden], dtype=dt, value=0.0))
        return pl.reshape(kept, [experts, rows, hidden])

    return live_expert_rows
