"""Every rank waits for a signal nobody sends: the job must end within --timeout-s with a wait report.

Rank r waits in region `never_notified` for its cell [r, 0] to reach r + 7.
"""
import pypto.language as pl
import pypto.language.distributed as pld

NR = pl.dynamic("NR")


@pl.jit
def wait_forever(
    out: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
    signal: pld.DistributedTensor[[NR, 1], pl.INT32],
):
    signal.bind_dynamic(0, NR)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="never_notified"):
        me = pld.rank(pld.get_comm_ctx(signal))
        pld.system.wait(signal=signal, offsets=[me, 0], expected=me + 7, cmp=pld.WaitCmp.Ge)
        out = pl.store(pl.full([1, 8], dtype=pl.FP32, value=1.0), [0, 0], out)
    return out


def main():
    import torch

    world = pld.world_size()
    signal = pld.window(pld.alloc_window_buffer([world, 1], dtype=pl.INT32), [world, 1], dtype=pl.INT32)
    wait_forever(torch.zeros(1, 8), signal)


if __name__ == "__main__":
    main()
