"""MoE dispatch + combine from a host-form program (`@pl.jit.host`) with windows the program allocates.

    pypto-run dispatch_host_form.py

The library's kernels (pypto_rt.kernels.moe.dispatch) are dispatched per rank with `device=r`; between them an
"expert" kernel multiplies each local expert's rows by (global expert id + 1), and the combine adds x itself,
so the output must be out[r, t] = x[r, t] * (1 + sum_k w[r, t, k] * (e[r, t, k] + 1)). Every rank routes all T tokens (the host form passes
one shape for every rank).
"""
import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto.ir.distributed_compiled_program import DistributedConfig
from golden import TensorSpec, run_jit
from pypto_rt.kernels.moe.dispatch import SIGNALS, Layout, combine_kernel, dispatch_kernel

N, E_LOCAL, K, T, H = 2, 2, 2, 4, 32
E = N * E_LOCAL
LANES = N * T
ROWS = E_LOCAL * LANES
LAYOUT = Layout(world=N, num_experts=E, top_k=K, max_tokens=T, hidden=H, dtype=torch.float32)
moe_dispatch = dispatch_kernel(LAYOUT)
moe_combine = combine_kernel(LAYOUT)


@pl.jit
def scale_experts(rows: pl.Tensor[[ROWS + 1, H], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, H], pl.FP32]],
                  me: pl.Scalar[pl.INT32]):
    for e in pl.spmd(E_LOCAL, name_hint="scale_expert"):
        block = pl.load(rows, [e * LANES, 0], [LANES, H])
        y[e * LANES : (e + 1) * LANES, :] = pl.mul(block, pl.cast(me * E_LOCAL + e + 1, pl.FP32))
    return y


@pl.jit.host
def moe_round_trip(
    x: pl.Tensor[[N, T, H], pl.FP32],
    topk_idx: pl.Tensor[[N, T, K], pl.INT32],
    topk_weights: pl.Tensor[[N, T, K], pl.FP32],
    out: pl.Out[pl.Tensor[[N, T, H], pl.FP32]],
    epoch: pl.Tensor[[N, 1, 1], pl.INT32],
    route_pos: pl.Tensor[[N, T, K], pl.FP32],
    slots: pl.Tensor[[N, T, N], pl.FP32],
    members: pl.Tensor[[N, T, N], pl.FP32],
    count_row: pl.Tensor[[N, 1, E + N], pl.INT32],
    send_x: pl.Tensor[[N, LANES + 1, H], pl.FP32],
    send_meta: pl.Tensor[[N, LANES + 1, 2 * K], pl.FP32],
    recv_rows: pl.Tensor[[N, ROWS + 1, H], pl.FP32],
    recv_counts: pl.Tensor[[N, 1, E_LOCAL], pl.INT32],
    y: pl.Tensor[[N, ROWS, H], pl.FP32],
    sums: pl.Tensor[[N, LANES + 1, H], pl.FP32],
    routes: pl.Tensor[[N, LANES, K], pl.INT32],
):
    counts_buf = pld.alloc_window_buffer([N, E + N], dtype=pl.INT32)
    tokens_buf = pld.alloc_window_buffer([LANES, H], dtype=pl.FP32)
    meta_buf = pld.alloc_window_buffer([LANES, 2 * K], dtype=pl.FP32)
    back_buf = pld.alloc_window_buffer([LANES + 1, H], dtype=pl.FP32)   # + the zero row the reduce reads
    signals_buf = pld.alloc_window_buffer([N, SIGNALS], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        counts_in = pld.window(counts_buf, [N, E + N], dtype=pl.INT32)
        tokens_in = pld.window(tokens_buf, [LANES, H], dtype=pl.FP32)
        meta_in = pld.window(meta_buf, [LANES, 2 * K], dtype=pl.FP32)
        back_in = pld.window(back_buf, [LANES + 1, H], dtype=pl.FP32)
        signals = pld.window(signals_buf, [N, SIGNALS], dtype=pl.INT32)
        moe_dispatch(x[r], topk_idx[r], topk_weights[r], r, epoch[r], route_pos[r], slots[r], members[r],
                     count_row[r], send_x[r], send_meta[r], recv_rows[r], recv_counts[r], routes[r], counts_in,
                     tokens_in, meta_in, signals, device=r)
        scale_experts(recv_rows[r], y[r], r, device=r)
        moe_combine(y[r], r, epoch[r], slots[r], members[r], x[r], out[r], sums[r], routes[r], counts_in, meta_in,
                    back_in, signals, device=r)


def routing():
    return torch.stack([torch.stack([torch.randperm(E)[:K] for _ in range(T)]) for _ in range(N)]).to(torch.int32)


def golden(values):
    scale = (values["topk_idx"].float() + 1) * values["topk_weights"]
    values["out"][:] = values["x"] * (scale.sum(dim=-1, keepdim=True) + 1)   # + x: the combine's addend


def scratch(name, shape, dtype):
    return TensorSpec(name, shape, dtype, init_value=torch.zeros)


specs = [
    TensorSpec("x", [N, T, H], torch.float32, init_value=torch.randn),
    TensorSpec("topk_idx", [N, T, K], torch.int32, init_value=routing),
    TensorSpec("topk_weights", [N, T, K], torch.float32, init_value=torch.rand),
    TensorSpec("out", [N, T, H], torch.float32, is_output=True),
    scratch("epoch", [N, 1, 1], torch.int32), scratch("route_pos", [N, T, K], torch.float32),
    scratch("slots", [N, T, N], torch.float32), scratch("members", [N, T, N], torch.float32),
    scratch("count_row", [N, 1, E + N], torch.int32),
    scratch("send_x", [N, LANES + 1, H], torch.float32), scratch("send_meta", [N, LANES + 1, 2 * K], torch.float32),
    scratch("recv_rows", [N, ROWS + 1, H], torch.float32), scratch("recv_counts", [N, 1, E_LOCAL], torch.int32),
    scratch("y", [N, ROWS, H], torch.float32),
    scratch("sums", [N, LANES + 1, H], torch.float32), scratch("routes", [N, LANES, K], torch.int32),
]

if __name__ == "__main__":
    result = run_jit(fn=moe_round_trip, specs=specs, golden_fn=golden, rtol=1e-5, atol=1e-5,
                     compile_cfg=dict(distributed_config=DistributedConfig(device_ids=list(range(N)))))
    raise SystemExit(0 if result.passed else 1)
