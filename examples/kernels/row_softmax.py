"""Row softmax over a wide row, in column chunks with an online max/sum.

    y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :])))
"""
import pypto.language as pl

ROWS = 128
COLS = 512
ROW_TILE = 32
COL_TILE = 128


@pl.jit
def row_softmax(
    x: pl.Tensor[[ROWS, COLS], pl.FP32],
    y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
):
    for r0 in pl.parallel(0, ROWS, ROW_TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row_softmax"):
            run_max = pl.full([ROW_TILE, 1], dtype=pl.FP32, value=-3.0e38)
            run_sum = pl.full([ROW_TILE, 1], dtype=pl.FP32, value=0.0)
            for cb in pl.range(COLS // COL_TILE):
                x_tile = x[r0 : r0 + ROW_TILE, cb * COL_TILE : (cb + 1) * COL_TILE]
                new_max = pl.maximum(run_max, pl.row_max(x_tile))
                rescale = pl.exp(pl.sub(run_max, new_max))
                chunk_sum = pl.row_sum(pl.exp(pl.row_expand_sub(x_tile, new_max)))
                run_sum = pl.add(pl.mul(run_sum, rescale), chunk_sum)
                run_max = new_max
            for cb in pl.range(COLS // COL_TILE):
                x_tile = x[r0 : r0 + ROW_TILE, cb * COL_TILE : (cb + 1) * COL_TILE]
                probs = pl.row_expand_div(pl.exp(pl.row_expand_sub(x_tile, run_max)), run_sum)
                y[r0 : r0 + ROW_TILE, cb * COL_TILE : (cb + 1) * COL_TILE] = probs
    return y


def golden_row_softmax(values):
    import torch

    values["y"][:] = torch.softmax(values["x"], dim=-1)


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, run_jit

    specs = [
        TensorSpec("x", [ROWS, COLS], torch.float32, init_value=torch.randn),
        TensorSpec("y", [ROWS, COLS], torch.float32, is_output=True),
    ]
    result = run_jit(fn=row_softmax, specs=specs, golden_fn=golden_row_softmax, rtol=1e-5, atol=1e-6)
    raise SystemExit(0 if result.passed else 1)
