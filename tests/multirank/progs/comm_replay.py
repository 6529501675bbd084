"""A communicating entry called every step with the same shapes must replay (launched form, PYPTO_STATS=1).

Each call, every rank puts its rows into the next rank's inbox with the live-row count, signals with the call's
epoch (read inside the region from a tensor element), waits for the previous rank's, and copies the live rows it
received (a loop bounded by the count, read inside the region from the window) into `out`; then it acknowledges,
so the next call's put cannot overwrite rows not yet taken. Every call is checked against torch; each rank prints
`rank r: PASS <kind of each call>` (run_stats) or FAIL.
"""
import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt import run_stats

R, D = 8, 32
NR = pl.dynamic("NR")
CALLS = 12


@pl.jit
def ring_step(
    rows: pl.Tensor[[R, D], pl.FP32],
    meta: pl.Tensor[[1, 2], pl.INT32],           # [[epoch, live rows this rank sends]]
    out: pl.Out[pl.Tensor[[R, D], pl.FP32]],
    inbox: pld.DistributedTensor[[R, D], pl.FP32],
    count: pld.DistributedTensor[[1, 1], pl.INT32],
    signal: pld.DistributedTensor[[NR, 2], pl.INT32],
):
    signal.bind_dynamic(0, NR)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_step"):
        ctx = pld.get_comm_ctx(inbox)
        me = pld.rank(ctx)
        world = pld.nranks(ctx)
        nxt = (me + 1) % world
        prv = (me + world - 1) % world
        epoch = pl.read(meta, [0, 0])
        pld.tensor.put(dst=inbox, peer=nxt, src=rows, dst_offsets=[0, 0], src_offsets=[0, 0], shape=[R, D])
        pld.tile.remote_store(pl.load(meta, [0, 1], [1, 1]), target=count, peer=nxt, offsets=[0, 0])
        pld.system.notify(signal, peer=nxt, offsets=[me, 0], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[prv, 0], expected=epoch, cmp=pld.WaitCmp.Ge)
        live = pl.read(count, [0, 0])
        for i in pl.range(live):
            out = pl.store(pl.load(inbox, [i, 0], [1, D]), [i, 0], out)
        pld.system.notify(signal, peer=prv, offsets=[me, 1], value=epoch, op=pld.NotifyOp.Set)
        pld.system.wait(signal=signal, offsets=[nxt, 1], expected=epoch, cmp=pld.WaitCmp.Ge)
    return out


def data(rank: int, call: int):
    rows = torch.randn(R, D, generator=torch.Generator().manual_seed(1000 * rank + call))
    return rows, (5 * call + 3 * rank) % (R + 1)


def main():
    me, world = pld.rank(), pld.world_size()
    inbox = pld.window(pld.alloc_window_buffer([R, D], dtype=pl.FP32), [R, D], dtype=pl.FP32)
    count = pld.window(pld.alloc_window_buffer([1, 1], dtype=pl.INT32), [1, 1], dtype=pl.INT32)
    signal = pld.window(pld.alloc_window_buffer([world, 2], dtype=pl.INT32), [world, 2], dtype=pl.INT32)
    kinds, ok = [], True
    for call in range(CALLS):
        rows, live = data(me, call)
        out = torch.zeros(R, D)
        with run_stats.collect() as stats:
            ring_step(rows, torch.tensor([[call + 1, live]], dtype=torch.int32), out, inbox, count, signal)
        kinds.append(stats.replay.kind)
        prev_rows, prev_live = data((me - 1) % world, call)
        want = torch.zeros(R, D)
        want[:prev_live] = prev_rows[:prev_live]
        ok = ok and torch.equal(out, want)
    print(f"rank {me}: {'PASS' if ok else 'FAIL'} {' '.join(kinds)}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
