"""BF16 GEMM with an FP32 accumulator over K tiles, dispatched with pl.spmd.

    c = bf16(a @ b)      a: [M, K], b: [K, N]
"""
import pypto.language as pl

M = 128
K = 256
N = 256
M_TILE = 64
N_TILE = 64
K_TILE = 64


@pl.jit
def gemm_bf16(
    a: pl.Tensor[[M, K], pl.BF16],
    b: pl.Tensor[[K, N], pl.BF16],
    c: pl.Out[pl.Tensor[[M, N], pl.BF16]],
):
    for blk in pl.spmd((M // M_TILE) * (N // N_TILE), name_hint="gemm_tile"):
        m0 = (blk // (N // N_TILE)) * M_TILE
        n0 = (blk % (N // N_TILE)) * N_TILE
        acc = pl.full([M_TILE, N_TILE], dtype=pl.FP32, value=0.0)
        for kb in pl.pipeline(K // K_TILE, stage=2):
            k0 = kb * K_TILE
            acc = pl.matmul_acc(acc, a[m0 : m0 + M_TILE, k0 : k0 + K_TILE], b[k0 : k0 + K_TILE, n0 : n0 + N_TILE])
        c[m0 : m0 + M_TILE, n0 : n0 + N_TILE] = pl.cast(acc, target_type=pl.BF16, mode="rint")
    return c


def golden_gemm_bf16(values):
    values["c"][:] = (values["a"].float() @ values["b"].float()).bfloat16()


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, run_jit

    specs = [
        TensorSpec("a", [M, K], torch.bfloat16, init_value=torch.randn),
        TensorSpec("b", [K, N], torch.bfloat16, init_value=torch.randn),
        TensorSpec("c", [M, N], torch.bfloat16, is_output=True),
    ]
    result = run_jit(fn=gemm_bf16, specs=specs, golden_fn=golden_gemm_bf16, rtol=1e-2, atol=1e-2)
    raise SystemExit(0 if result.passed else 1)
