"""Scaled residual add: out = x * alpha + residual, tiled over rows and columns.

    out[r, c] = x[r, c] * alpha + residual[r, c]
"""
import pypto.language as pl

ROWS = 512
COLS = 256
ROW_TILE = 64
COL_TILE = 128


@pl.jit
def scaled_residual(
    x: pl.Tensor[[ROWS, COLS], pl.FP32],
    residual: pl.Tensor[[ROWS, COLS], pl.FP32],
    alpha: pl.Scalar[pl.FP32],
    out: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
):
    for r0 in pl.parallel(0, ROWS, ROW_TILE):
        for c0 in pl.range(0, COLS, COL_TILE):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="scaled_residual"):
                x_tile = x[r0 : r0 + ROW_TILE, c0 : c0 + COL_TILE]
                res_tile = residual[r0 : r0 + ROW_TILE, c0 : c0 + COL_TILE]
                out[r0 : r0 + ROW_TILE, c0 : c0 + COL_TILE] = pl.add(pl.mul(x_tile, alpha), res_tile)
    return out


def golden_scaled_residual(values):
    values["out"][:] = values["x"] * values["alpha"] + values["residual"]


if __name__ == "__main__":
    import torch
    from golden import ScalarSpec, TensorSpec, run_jit

    specs = [
        TensorSpec("x", [ROWS, COLS], torch.float32, init_value=torch.randn),
        TensorSpec("residual", [ROWS, COLS], torch.float32, init_value=torch.randn),
        ScalarSpec("alpha", torch.float32, 0.5),
        TensorSpec("out", [ROWS, COLS], torch.float32, is_output=True),
    ]
    result = run_jit(fn=scaled_residual, specs=specs, golden_fn=golden_scaled_residual, rtol=1e-5, atol=1e-5)
    raise SystemExit(0 if result.passed else 1)
