"""Every pld data op on a 3-rank job, checked against torch on each rank (prints PASS/FAIL per check).

Inside kernels: pld.tensor.put into the next rank's window and pld.tensor.get back from the previous one,
pld.tile.remote_store with atomic add from every rank into rank 0's accumulator, and pld.allreduce of a
tensor. From plain Python: allreduce (max), allgather, reduce_scatter, all_to_all, all_to_all_v (uneven
live rows), broadcast and barrier on torch tensors.
"""
import torch

import pypto.language as pl
import pypto.language.distributed as pld

R, C = 4, 16


@pl.jit
def ring_put(mine: pl.Tensor[[R, C], pl.FP32], inbox: pld.DistributedTensor[[R, C], pl.FP32],
             flag: pld.DistributedTensor[[3, 1], pl.INT32], me: pl.Scalar[pl.INT32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="put"):
        nxt = (me + 1) % 3
        pld.tensor.put(dst=inbox, peer=nxt, src=mine, dst_offsets=[0, 0], src_offsets=[0, 0], shape=[R, C])
        pld.system.notify(flag, peer=nxt, offsets=[me, 0], value=1, op=pld.NotifyOp.AtomicAdd)
    return inbox


@pl.jit
def take_back(out: pl.Out[pl.Tensor[[R, C], pl.FP32]], inbox: pld.DistributedTensor[[R, C], pl.FP32],
              flag: pld.DistributedTensor[[3, 1], pl.INT32], me: pl.Scalar[pl.INT32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="get"):
        prv = (me + 2) % 3
        pld.system.wait(signal=flag, offsets=[prv, 0], expected=1, cmp=pld.WaitCmp.Ge)
        # what the next rank received from me (my own rows), read back out of its window
        pld.tensor.get(dst=out, peer=(me + 1) % 3, src=inbox, dst_offsets=[0, 0], src_offsets=[0, 0], shape=[R, C])
    return out


@pl.jit
def accumulate(mine: pl.Tensor[[R, C], pl.FP32], acc: pld.DistributedTensor[[R, C], pl.FP32],
               total: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="accumulate"):
        pld.tile.remote_store(pl.load(mine, [0, 0], [R, C]), target=acc, peer=0, offsets=[0, 0],
                              atomic=pl.AtomicType.Add)
        pld.allreduce(total)
    return total


def main():
    me, world = pld.rank(), pld.world_size()
    assert world == 3, world
    torch.manual_seed(7)
    rows = torch.randn(world, R, C)
    inbox = pld.window(pld.alloc_window_buffer([R, C], dtype=pl.FP32), [R, C], dtype=pl.FP32)
    flag = pld.window(pld.alloc_window_buffer([3, 1], dtype=pl.INT32), [3, 1], dtype=pl.INT32)
    acc = pld.window(pld.alloc_window_buffer([R, C], dtype=pl.FP32), [R, C], dtype=pl.FP32)
    checks = {}

    ring_put(rows[me].clone(), inbox, flag, me)
    out = torch.zeros(R, C)
    take_back(out, inbox, flag, me)
    pld.barrier()   # every put has landed before anyone reads its inbox
    checks["put lands in the next rank's window"] = torch.equal(inbox, rows[(me + 2) % 3])
    checks["get reads a peer's window"] = torch.equal(out, rows[me])

    total = torch.full((R, C), float(me + 1))
    accumulate(rows[me].clone(), acc, total)
    pld.barrier()
    if me == 0:
        checks["atomic remote_store adds every rank's rows"] = torch.allclose(acc, rows.sum(0), atol=1e-6)
    checks["allreduce inside a kernel"] = torch.equal(total, torch.full((R, C), 6.0))

    t = torch.full((5,), float(me))
    pld.allreduce(t, op=pld.ReduceOp.Max)
    checks["allreduce max"] = torch.equal(t, torch.full((5,), 2.0))
    gathered = torch.zeros(world, R, C)
    pld.allgather(gathered, rows[me].clone())
    checks["allgather"] = torch.equal(gathered, rows)
    part = torch.zeros(1, C)
    pld.reduce_scatter(part, torch.ones(world, C) * (me + 1))
    checks["reduce_scatter"] = torch.equal(part, torch.full((1, C), 6.0))
    a2a = torch.zeros(world, C)
    pld.all_to_all(a2a, torch.arange(world, dtype=torch.float32)[:, None].expand(world, C) + 10 * me)
    checks["all_to_all"] = torch.equal(a2a, (torch.arange(world, dtype=torch.float32) * 10 + me)[:, None]
                                       .expand(world, C))
    send = [(me + dst) % 3 for dst in range(world)]           # rows for each destination: uneven
    recv = [(src + me) % 3 for src in range(world)]
    inp = torch.cat([torch.full((n, C), float(10 * me + dst)) for dst, n in enumerate(send)] + [torch.zeros(0, C)])
    got = torch.full((sum(recv) + 2, C), -1.0)               # extra rows: only live rows are written
    pld.all_to_all_v(got, inp, send, recv)
    want = torch.cat([torch.full((n, C), float(10 * src + me)) for src, n in enumerate(recv)])
    checks["all_to_all_v"] = torch.equal(got[:sum(recv)], want) and bool((got[sum(recv):] == -1).all())
    b = torch.full((3,), float(me))
    pld.broadcast(b, root=2)
    checks["broadcast"] = torch.equal(b, torch.full((3,), 2.0))

    for name, ok in checks.items():
        print(f"rank {me}: {name}: {'PASS' if ok else 'FAIL'}")
    raise SystemExit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
