"""Top-1 MoE expert parallelism across ranks, host form: dispatch, expert compute, combine.

Every rank holds TOKENS token rows and owns E_LOCAL of the N_RANKS * E_LOCAL experts. Each token goes to one
expert (routing is given); the expert multiplies the row by its weight matrix, and the result returns to the
token's own rank:

    out[r, t] = x[r, t] @ w[expert[r, t]]

Windows (one per rank, same layout everywhere):
    recv_x    [N_RANKS * TOKENS, D]   lane s = src * TOKENS + t holds source rank src's token t, if routed here
    recv_tag  [N_RANKS * TOKENS, 1]   local expert + 1 of that lane (0: empty; windows start zeroed)
    back      [TOKENS, D]             this rank's tokens after their experts, written by the expert's rank
    arrived   [N_RANKS, 1]            notify counters: row src counts src's dispatch, then its combine
"""
import pypto.language as pl
import pypto.language.distributed as pld

N_RANKS = 2
TOKENS = 8
D = 32
E_LOCAL = 2
LANES = N_RANKS * TOKENS


@pl.jit
def moe_layer(
    x: pl.Tensor[[TOKENS, D], pl.FP32],
    expert: pl.Tensor[[TOKENS, 1], pl.INT32],
    w_local: pl.Tensor[[E_LOCAL, D, D], pl.FP32],
    out: pl.Out[pl.Tensor[[TOKENS, D], pl.FP32]],
    recv_x: pld.DistributedTensor[[LANES, D], pl.FP32],
    recv_tag: pld.DistributedTensor[[LANES, 1], pl.INT32],
    back: pld.DistributedTensor[[TOKENS, D], pl.FP32],
    arrived: pld.DistributedTensor[[N_RANKS, 1], pl.INT32],
    me: pl.Scalar[pl.INT32],
):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="dispatch"):
        for t in pl.range(TOKENS):
            e = pl.read(expert, [t, 0])
            owner = e // E_LOCAL
            tag = pl.full([1, 1], dtype=pl.INT32, value=e - owner * E_LOCAL + 1)
            pld.tensor.put(dst=recv_x, peer=owner, src=x, dst_offsets=[me * TOKENS + t, 0],
                           src_offsets=[t, 0], shape=[1, D])
            pld.tile.remote_store(tag, target=recv_tag, peer=owner, offsets=[me * TOKENS + t, 0])
        for peer in pl.range(N_RANKS):
            pld.system.notify(arrived, peer=peer, offsets=[me, 0], value=1, op=pld.NotifyOp.AtomicAdd)

    with pl.at(level=pl.Level.CORE_GROUP, name_hint="experts_and_combine"):
        for src in pl.range(N_RANKS):
            pld.system.wait(signal=arrived, offsets=[src, 0], expected=1, cmp=pld.WaitCmp.Ge)
        for lane in pl.range(LANES):
            tag = pl.read(recv_tag, [lane, 0])
            if tag > 0:
                row = pl.load(recv_x, [lane, 0], [1, D])
                weight = pl.reshape(pl.load(w_local, [tag - 1, 0, 0], [1, D, D]), [D, D])
                y = pl.matmul(row, weight)
                src = lane // TOKENS
                pld.tile.remote_store(y, target=back, peer=src, offsets=[lane - src * TOKENS, 0])
        for peer in pl.range(N_RANKS):
            pld.system.notify(arrived, peer=peer, offsets=[me, 0], value=1, op=pld.NotifyOp.AtomicAdd)

    with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather_results"):
        for src in pl.range(N_RANKS):
            pld.system.wait(signal=arrived, offsets=[src, 0], expected=2, cmp=pld.WaitCmp.Ge)
        out = pl.store(pl.load(back, [0, 0], [TOKENS, D]), [0, 0], out)
    return out


@pl.jit.host
def moe_ep(
    x: pl.Tensor[[N_RANKS, TOKENS, D], pl.FP32],
    expert: pl.Tensor[[N_RANKS, TOKENS, 1], pl.INT32],
    w: pl.Tensor[[N_RANKS, E_LOCAL, D, D], pl.FP32],
    out: pl.Out[pl.Tensor[[N_RANKS, TOKENS, D], pl.FP32]],
):
    recv_x_buf = pld.alloc_window_buffer([LANES, D], dtype=pl.FP32)
    recv_tag_buf = pld.alloc_window_buffer([LANES, 1], dtype=pl.INT32)
    back_buf = pld.alloc_window_buffer([TOKENS, D], dtype=pl.FP32)
    arrived_buf = pld.alloc_window_buffer([N_RANKS, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        recv_x = pld.window(recv_x_buf, [LANES, D], dtype=pl.FP32)
        recv_tag = pld.window(recv_tag_buf, [LANES, 1], dtype=pl.INT32)
        back = pld.window(back_buf, [TOKENS, D], dtype=pl.FP32)
        arrived = pld.window(arrived_buf, [N_RANKS, 1], dtype=pl.INT32)
        moe_layer(x[r], expert[r], w[r], out[r], recv_x, recv_tag, back, arrived, r, device=r)


def golden_moe_ep(values):
    import torch

    experts = values["w"].reshape(N_RANKS * E_LOCAL, D, D)
    routed = experts[values["expert"][..., 0].long()]   # [N_RANKS, TOKENS, D, D]
    values["out"][:] = torch.einsum("rtd,rtde->rte", values["x"], routed)


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, run_jit
    from pypto.ir.distributed_compiled_program import DistributedConfig

    def routing():
        return torch.randint(0, N_RANKS * E_LOCAL, (N_RANKS, TOKENS, 1), dtype=torch.int32)

    specs = [
        TensorSpec("x", [N_RANKS, TOKENS, D], torch.float32, init_value=torch.randn),
        TensorSpec("expert", [N_RANKS, TOKENS, 1], torch.int32, init_value=routing),
        TensorSpec("w", [N_RANKS, E_LOCAL, D, D], torch.float32, init_value=torch.randn),
        TensorSpec("out", [N_RANKS, TOKENS, D], torch.float32, is_output=True),
    ]
    result = run_jit(fn=moe_ep, specs=specs, golden_fn=golden_moe_ep, rtol=1e-4, atol=1e-4,
                     compile_cfg=dict(distributed_config=DistributedConfig(device_ids=list(range(N_RANKS)))))
    raise SystemExit(0 if result.passed else 1)
