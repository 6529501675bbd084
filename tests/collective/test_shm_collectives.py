"""shm collectives on 2 and 4 forked ranks against torch references computed from every rank's inputs."""
from __future__ import annotations

import pytest
import torch
import torch.testing  # noqa: F401  (imported once here, not in every forked rank)

from tests.collective.harness import run_ranks


def data(rank: int, shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def reduce(parts, op):
    stacked = torch.stack([p.double() if p.dtype.is_floating_point else p for p in parts])
    out = {"sum": stacked.sum(0), "max": stacked.amax(0), "min": stacked.amin(0)}[op]
    return out.to(parts[0].dtype)


def check_close(got, want, exact):
    if exact:
        assert torch.equal(got, want), (got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-2 if got.dtype == torch.bfloat16 else 1e-5, atol=1e-2)


def collectives_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    with ctx.comm() as comm:
        for op in ("sum", "max", "min"):
            for dtype in (torch.float32, torch.bfloat16, torch.int32):
                t = data(me, (3, 5), dtype)
                comm.allreduce(t, op, label=f"ar-{op}")
                check_close(t, reduce([data(r, (3, 5), dtype) for r in range(w)], op), exact=op != "sum"
                            or not dtype.is_floating_point)
            # the same bits on every rank: gather each rank's result and compare
            t = data(me, (7,), seed=3)
            comm.allreduce(t, op)
            everyone = torch.empty(w, 7)
            comm.allgather(everyone, t)
            assert all(torch.equal(everyone[0], everyone[r]) for r in range(w))

            # large enough for the reduce-scatter + allgather path, uneven chunks
            big = data(me, (70_001,), seed=4)
            comm.allreduce(big, op)
            check_close(big, reduce([data(r, (70_001,), seed=4) for r in range(w)], op), exact=op != "sum")
            everyone = torch.empty(w, 70_001)
            comm.allgather(everyone, big)
            assert all(torch.equal(everyone[0], everyone[r]) for r in range(w))

        out = torch.empty(w, 2, 3, dtype=torch.int64)
        comm.allgather(out, data(me, (2, 3), torch.int64))
        assert torch.equal(out, torch.stack([data(r, (2, 3), torch.int64) for r in range(w)]))

        for op in ("sum", "max"):
            inp = data(me, (w * 2, 3), seed=5)
            rs = torch.empty(2, 3)
            comm.reduce_scatter(rs, inp, op)
            check_close(rs, reduce([data(r, (w * 2, 3), seed=5) for r in range(w)], op)[me * 2:me * 2 + 2],
                        exact=op == "max")

        inp = data(me, (w * 3, 2), seed=6)
        a2a = torch.empty_like(inp)
        comm.all_to_all(a2a, inp)
        want = torch.cat([data(r, (w * 3, 2), seed=6)[me * 3:me * 3 + 3] for r in range(w)])
        assert torch.equal(a2a, want)

        t = data(me, (4, 4), seed=7)
        comm.broadcast(t, src=w - 1)
        assert torch.equal(t, data(w - 1, (4, 4), seed=7))
        comm.barrier(label="end")
    return "ok"


def counts(src: int, dst: int) -> int:
    return (3 * src + 2 * dst) % 4   # uneven, some zero


def a2av_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    cap = 4 * w   # capacity rows: only the live ones travel or get written
    rows = lambda r: data(r, (cap, 3), seed=9)  # noqa: E731
    with ctx.comm() as comm:
        send = [counts(me, p) for p in range(w)]
        recv = [counts(r, me) for r in range(w)]
        out = torch.full((cap, 3), -7.0)
        comm.all_to_all_v(out, rows(me), send, recv, label="dispatch")
        want = []
        for r in range(w):
            start = sum(counts(r, p) for p in range(me))
            want.append(rows(r)[start:start + counts(r, me)])
        want = torch.cat(want)
        assert torch.equal(out[:len(want)], want)
        assert (out[len(want):] == -7.0).all()   # rows past sum(recv) untouched
        # a large call grows the staging segments; the next small one still works
        big = torch.arange(w * 70000, dtype=torch.float32).view(w * 70000, 1) + me
        big_out = torch.empty_like(big)
        comm.all_to_all_v(big_out, big, [70000] * w, [70000] * w)
        assert torch.equal(big_out[70000 * 0:70000], torch.arange(70000.0).view(-1, 1) + me * 70000)
        comm.all_to_all_v(out, rows(me), send, recv)
        assert torch.equal(out[:len(want)], want)
    return "ok"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_match_torch_references(world):
    outcome = run_ranks(collectives_rank, world)
    assert outcome.ok() == {r: "ok" for r in range(world)}
    assert outcome.leftovers == []   # the communicators owned and unlinked their segments


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_v_sends_variable_rows(world):
    outcome = run_ranks(a2av_rank, world)
    assert outcome.ok() == {r: "ok" for r in range(world)}
    assert outcome.leftovers == []


def noncontiguous_rank(ctx):
    with ctx.comm() as comm:
        base = torch.arange(12.0).view(3, 4) * (ctx.rank + 1)
        t = base.t()               # not contiguous
        comm.allreduce(t)
        assert torch.equal(t, (torch.arange(12.0).view(3, 4) * 3).t())
    return "ok"


@pytest.mark.timeout(60)
def test_allreduce_of_a_non_contiguous_tensor():
    assert run_ranks(noncontiguous_rank, 2).ok() == {0: "ok", 1: "ok"}
