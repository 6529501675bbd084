"""Row-wise top-k with sort32 + mrgsort, split into value and index lanes by mask gathers.

    vals, idx = topk(scores[r, :], K)   per row, descending
"""
import pypto.language as pl

ROWS = 16
N = 256
K = 8


@pl.jit
def row_topk(
    scores: pl.Tensor[[ROWS, N], pl.FP32],
    vals: pl.Out[pl.Tensor[[ROWS, K], pl.FP32]],
    idx: pl.Out[pl.Tensor[[ROWS, K], pl.INT32]],
):
    for r in pl.parallel(ROWS):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row_topk"):
            col_ids = pl.arange(0, [1, N], dtype=pl.UINT32)
            pairs = pl.sort32(scores[r : r + 1, :], col_ids)
            pairs = pl.mrgsort(pairs, block_len=64)
            pairs = pl.mrgsort(pairs[:, 0:256], pairs[:, 256:512])
            best = pairs[:, 0 : 2 * K]
            vals[r : r + 1, :] = pl.gather(best, mask_pattern=pl.tile.MaskPattern.P0101)
            idx[r : r + 1, :] = pl.gather(best, mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
    return vals, idx


def golden_row_topk(values):
    import torch

    top_vals, top_idx = torch.topk(values["scores"], K, dim=-1)
    values["vals"][:] = top_vals
    values["idx"][:] = top_idx.to(torch.int32)


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, run_jit, topk_pair_compare

    specs = [
        TensorSpec("scores", [ROWS, N], torch.float32, init_value=torch.randn),
        TensorSpec("vals", [ROWS, K], torch.float32, is_output=True),
        TensorSpec("idx", [ROWS, K], torch.int32, is_output=True),
    ]
    result = run_jit(fn=row_topk, specs=specs, golden_fn=golden_row_topk, rtol=0, atol=0,
                     compare_fn={"idx": topk_pair_compare("vals")})
    raise SystemExit(0 if result.passed else 1)
