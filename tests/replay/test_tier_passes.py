"""Passes over the compiled tier's traced graph (replay.tier_passes): a matmul's K steps joined into one product.

What users depend on: the joined graph computes the same product (within float reordering for K steps, bit for bit
for output tiles), only sums over adjacent K ranges of the same operands are joined, and tile writes only where
nothing between them changes memory or reads the output.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pypto_rt.replay.tier_passes import join_k_steps, join_tiles

M, K, N, STEP = 8, 32, 16, 8


def products(graph) -> int:
    return sum(node.target is torch.ops.aten.mm.default for node in graph.graph.nodes)


def k_loop(a, w, out):
    """c02's shape: bf16 operands cast to fp32, the right one stored transposed, K in steps, the sum written."""
    acc = None
    for k0 in range(0, K, STEP):
        step = torch.mm(a[:, k0:k0 + STEP].float(), w[:, k0:k0 + STEP].float().t())
        acc = step if acc is None else torch.add(acc, step)
    out[:, :] = acc.bfloat16()
    return (out,)


def test_a_k_loop_becomes_one_product_with_the_same_result():
    a, w = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)
    graph = make_fx(k_loop)(a, w, torch.empty(M, N, dtype=torch.bfloat16))
    assert products(graph) == K // STEP
    assert join_k_steps(graph) == K // STEP - 1 and products(graph) == 1
    want, got = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    k_loop(a, w, want)
    graph(a, w, got)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, (a.float() @ w.float().t()).bfloat16())


def test_products_over_ranges_that_do_not_follow_each_other_or_of_other_tensors_stay_apart():
    def gapped(a, b, c):
        return (torch.add(torch.mm(a[:, 0:8], b[0:8, :]), torch.mm(a[:, 16:24], b[16:24, :])),
                torch.add(torch.mm(a[:, 0:8], b[0:8, :]), torch.mm(c[:, 8:16], b[8:16, :])),
                torch.add(torch.mm(a[:, 0:8], b[0:8, :]), torch.mm(a[:, 8:16], b[16:24, :])))
    a, b, c = torch.randn(M, K), torch.randn(K, N), torch.randn(M, K)
    graph = make_fx(gapped)(a, b, c)
    assert join_k_steps(graph) == 0


def test_a_sum_in_either_order_is_joined():
    def reversed_sum(a, b):
        return (torch.add(torch.mm(a[:, 8:16], b[8:16, :]), torch.mm(a[:, 0:8], b[0:8, :])),)
    a, b = torch.randn(M, K), torch.randn(K, N)
    graph = make_fx(reversed_sum)(a, b)
    assert join_k_steps(graph) == 1 and products(graph) == 1
    torch.testing.assert_close(graph(a, b)[0], a[:, :16] @ b[:16, :])


TILE_M, TILE_N = 4, 8


def tiles(a, w, out):
    """c02's grid: one product per output tile, cast and written into its box of `out`."""
    for m0 in range(0, M, TILE_M):
        for n0 in range(0, N, TILE_N):
            out[m0:m0 + TILE_M, n0:n0 + TILE_N] = torch.mm(a[m0:m0 + TILE_M, :].float(),
                                                            w[n0:n0 + TILE_N, :].float().t()).bfloat16()
    return (out,)


def test_a_grid_of_tile_writes_becomes_one_product_bit_for_bit():
    a, w = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)
    graph = make_fx(tiles)(a, w, torch.empty(M, N, dtype=torch.bfloat16))
    grid = (M // TILE_M) * (N // TILE_N)
    assert products(graph) == grid and join_tiles(graph) == grid - 1 and products(graph) == 1
    want, got = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    tiles(a, w, want)
    graph(a, w, got)
    assert torch.equal(got, want)


def test_tile_writes_with_a_read_of_the_output_between_them_stay_apart():
    def read_between(a, w, out, seen):
        out[0:TILE_M, :] = torch.mm(a[0:TILE_M, :], w)
        seen.copy_(out[0:TILE_M, :].sum())   # (reads the first tile: must see it written)
        out[TILE_M:2 * TILE_M, :] = torch.mm(a[TILE_M:2 * TILE_M, :], w)
        return (out, seen)
    a, w = torch.randn(M, K), torch.randn(K, N)
    graph = make_fx(read_between)(a, w, torch.empty(M, N), torch.empty(()))
    assert join_tiles(graph) == 0
