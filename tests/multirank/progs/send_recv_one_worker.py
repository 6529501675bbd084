"""Send, then receive, on every rank of a 2-rank job; meant for PYPTO_NUM_WORKERS=1.

Program order on each rank: `slow` (compute, no windows) -> `send` (stores `slow`'s result into this rank's
window and notifies the peer) -> `recv` (waits for the peer's notify, then loads the peer's window).
`send` reads `slow`'s output, so it becomes ready only when `slow` finishes; `recv` shares no tensor-map
tensor with either (windows make no tensor-map accesses). Without the per-rank program-order chain of
communication tasks, `recv` is ready first and the rank's only worker takes it while `send` waits behind
it: each rank waits for a notify its peer never sends (runtime_model §4.5). With the chain, `recv` waits
for `send`.
"""
import pypto.language as pl
import pypto.language.distributed as pld

N = 128
REPEAT = 150   # matmuls in `slow`: it must still run when the host has submitted `send` and `recv`


@pl.jit
def exchange(
    x: pl.Tensor[[N, N], pl.FP32],
    eye: pl.Tensor[[N, N], pl.FP32],
    t: pl.Out[pl.Tensor[[N, N], pl.FP32]],
    out: pl.Out[pl.Tensor[[N, N], pl.FP32]],
    data: pld.DistributedTensor[[N, N], pl.FP32],
    signal: pld.DistributedTensor[[2, 1], pl.INT32],
):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="slow"):
        e = pl.load(eye, [0, 0], [N, N])
        acc = pl.load(x, [0, 0], [N, N])
        for _ in pl.range(REPEAT):
            acc = pl.matmul(acc, e)
        t = pl.store(acc, [0, 0], t)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="send"):
        me = pld.rank(pld.get_comm_ctx(signal))
        data = pl.store(pl.load(t, [0, 0], [N, N]), [0, 0], data)
        pld.system.notify(signal, peer=1 - me, offsets=[me, 0], value=1, op=pld.NotifyOp.AtomicAdd)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="recv"):
        peer = 1 - pld.rank(pld.get_comm_ctx(signal))
        pld.system.wait(signal=signal, offsets=[peer, 0], expected=1, cmp=pld.WaitCmp.Ge)
        out = pl.store(pld.tile.remote_load(data, peer=peer, offsets=[0, 0], shape=[N, N]), [0, 0], out)
    return out


def main():
    import torch

    rank, world = pld.rank(), pld.world_size()
    assert world == 2, world
    data = pld.window(pld.alloc_window_buffer([N, N], dtype=pl.FP32), [N, N], dtype=pl.FP32)
    signal = pld.window(pld.alloc_window_buffer([2, 1], dtype=pl.INT32), [2, 1], dtype=pl.INT32)
    x = torch.full((N, N), float(rank + 1))
    out = torch.zeros(N, N)
    exchange(x, torch.eye(N), torch.zeros(N, N), out, data, signal)
    ok = torch.equal(out, torch.full((N, N), float(2 - rank)))
    print(f"rank {rank}/{world}: {'PASS' if ok else 'FAIL'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
