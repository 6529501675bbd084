"""The benchmarks' own @pl.jit kernels (conformance kernels live in tests/conformance)."""
import pypto.language as pl

# -- many tiny tasks: one 8x8 add per task ------------------------------------------------------------------
N_TILES = 1024
MAX_TILES = 4096
TILE = 8


@pl.jit
def add_tiles(
    x: pl.Tensor[[TILE * N_TILES, TILE], pl.FP32],
    y: pl.Out[pl.Tensor[[TILE * N_TILES, TILE], pl.FP32]],
):
    for i in pl.range(N_TILES):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_tile"):
            y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], 1.0)
    return y


@pl.jit
def add_tiles_n(
    x: pl.Tensor[[TILE * MAX_TILES, TILE], pl.FP32],
    n: pl.Scalar[pl.INT32],
    y: pl.Out[pl.Tensor[[TILE * MAX_TILES, TILE], pl.FP32]],
):
    for i in pl.range(n):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_tile"):
            y[i * TILE : (i + 1) * TILE, :] = pl.add(x[i * TILE : (i + 1) * TILE, :], 1.0)
    return y


# -- big tasks: FP32 GEMM, four 512x512 output tiles, K reduced in steps inside each task --------------------
MM = 1024
MK = 1024
MN = 1024
M_TILE = 512
N_TILE = 512
K_STEP = 256


@pl.jit
def matmul_512(
    a: pl.Tensor[[MM, MK], pl.FP32],
    b: pl.Tensor[[MK, MN], pl.FP32],
    c: pl.Out[pl.Tensor[[MM, MN], pl.FP32]],
):
    for m0 in pl.parallel(0, MM, M_TILE):
        for n0 in pl.parallel(0, MN, N_TILE):
            acc = pl.create_tensor([M_TILE, N_TILE], dtype=pl.FP32)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="matmul_tile"):
                for kb in pl.range(MK // K_STEP):
                    k0 = kb * K_STEP
                    a_tile = a[m0 : m0 + M_TILE, k0 : k0 + K_STEP]
                    b_tile = b[k0 : k0 + K_STEP, n0 : n0 + N_TILE]
                    if kb == 0:
                        acc = pl.matmul(a_tile, b_tile, out_dtype=pl.FP32)
                    else:
                        acc = pl.matmul_acc(acc, a_tile, b_tile)
                c[m0 : m0 + M_TILE, n0 : n0 + N_TILE] = acc
    return c


# -- the fixed cost of a replayed call: one 8x8 add, with 2 and with 16 tensor arguments -------------------------
@pl.jit
def add_one_tile(x: pl.Tensor[[TILE, TILE], pl.FP32], y: pl.Out[pl.Tensor[[TILE, TILE], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_one"):
        y[:, :] = pl.add(x, 1.0)
    return y


@pl.jit
def add_one_of_16(
    a0: pl.Tensor[[TILE, TILE], pl.FP32], a1: pl.Tensor[[TILE, TILE], pl.FP32],
    a2: pl.Tensor[[TILE, TILE], pl.FP32], a3: pl.Tensor[[TILE, TILE], pl.FP32],
    a4: pl.Tensor[[TILE, TILE], pl.FP32], a5: pl.Tensor[[TILE, TILE], pl.FP32],
    a6: pl.Tensor[[TILE, TILE], pl.FP32], a7: pl.Tensor[[TILE, TILE], pl.FP32],
    a8: pl.Tensor[[TILE, TILE], pl.FP32], a9: pl.Tensor[[TILE, TILE], pl.FP32],
    a10: pl.Tensor[[TILE, TILE], pl.FP32], a11: pl.Tensor[[TILE, TILE], pl.FP32],
    a12: pl.Tensor[[TILE, TILE], pl.FP32], a13: pl.Tensor[[TILE, TILE], pl.FP32],
    a14: pl.Tensor[[TILE, TILE], pl.FP32],
    y: pl.Out[pl.Tensor[[TILE, TILE], pl.FP32]],
):
    """A serving kernel's argument list (weights, caches, tables, outputs) around the smallest body: 16 tensors."""
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_one"):
        y[:, :] = pl.add(a0, 1.0)
    return y
