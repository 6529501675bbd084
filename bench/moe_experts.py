"""Benchmark 9 - the MoE routed experts (`run_experts`, bf16 and W8A8, compiled executor, repeated calls) against
the loop a torch user writes (per expert: the live rows' three bf16 linear layers, counts read on the host), on
the dispatch layout of one rank of 8 (E = 64, 8 local experts, T_MAX = 64, top-8): decode (T = 8 per rank) and
prefill-sized (T = 64) routing, uniform and skewed (every route to one local expert); and the spmd split of a
skewed expert's row tiles over EXPERT_SPLIT blocks against one block per expert."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.timing import interleaved, ratio, table

TITLE = "9. MoE routed experts against a torch loop"
HIDDEN, INTER, N_LOCAL, WORLD, T_MAX, TOP_K = 256, 128, 8, 8, 64, 8


def _counts(tokens: int, skewed: bool) -> torch.Tensor:
    """Live rows per local expert when each of WORLD ranks sends `tokens` tokens with TOP_K routes over 64 experts."""
    if skewed:       # every token of every rank has one route to local expert 0
        return torch.tensor([WORLD * tokens] + [0] * (N_LOCAL - 1), dtype=torch.int32)
    return torch.full((N_LOCAL,), WORLD * tokens * TOP_K // (N_LOCAL * WORLD), dtype=torch.int32)


def _torch_loop(weights, recv_x, counts):
    y = torch.zeros_like(recv_x)
    for e, n in enumerate(counts.tolist()):
        if n:
            x = recv_x[e, :n]
            y[e, :n] = F.linear(F.silu(F.linear(x, weights.w_gate[e])) * F.linear(x, weights.w_up[e]),
                                weights.w_down[e])
    return y


def run(repeats: int = 5) -> str:
    from pypto_rt import config
    from pypto_rt.kernels.moe import ExpertWeights, MoEConfig, run_experts
    from pypto_rt.kernels.moe import experts as experts_module

    gen = torch.Generator().manual_seed(0)
    cfg = MoEConfig(hidden=HIDDEN, num_experts=N_LOCAL * WORLD, top_k=TOP_K, max_tokens_per_rank=T_MAX,
                    intermediate_size=INTER)
    weights = ExpertWeights(*((torch.randn(N_LOCAL, *shape, generator=gen) * 0.05).bfloat16()
                              for shape in ((INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER))))
    quantized = weights.quantize()
    recv_x = torch.randn(N_LOCAL, WORLD * T_MAX, HIDDEN, generator=gen).bfloat16()

    def kernel(form, counts, split=experts_module.EXPERT_SPLIT):
        def call():
            experts_module.EXPERT_SPLIT = split
            with config.scope(EXECUTOR="compiled"):
                run_experts(cfg, form, recv_x, counts)
        return call

    rows, split_rows = [], []
    default_split = experts_module.EXPERT_SPLIT
    try:
        for label, tokens in (("decode T=8", 8), ("prefill T=64", 64)):
            for skewed in (False, True):
                counts = _counts(tokens, skewed)
                t = interleaved({"bf16": kernel(weights, counts), "int8": kernel(quantized, counts),
                                 "torch": lambda: _torch_loop(weights, recv_x, counts)}, repeats)
                rows.append([label, "skewed" if skewed else "uniform", str(counts.tolist()),
                             ratio(t["bf16"] / t["torch"]), ratio(t["int8"] / t["torch"]),
                             f"{t['torch'] * 1e3:.2f} ms"])
        counts = _counts(64, True)
        t = interleaved({"split": kernel(weights, counts, default_split), "one": kernel(weights, counts, 1)},
                        repeats)
        split_rows.append([f"EXPERT_SPLIT={default_split}", "1", ratio(t["split"] / t["one"])])
    finally:
        experts_module.EXPERT_SPLIT = default_split
    return "\n".join([
        table(["routing", "spread", "live rows per local expert", "bf16 kernel / torch", "int8 kernel / torch",
               "torch loop"], rows), "",
        table(["skewed prefill: blocks per expert", "against", "time ratio"], split_rows), "",
        f"Shapes: H={HIDDEN}, I={INTER}, {N_LOCAL} local experts of R={WORLD * T_MAX} rows; the torch loop reads "
        "the counts on the host, the kernels read them inside their blocks. No target: context for MoELayer."])
