"""The MoE dispatch benchmark's inputs, golden and byte accounting (one process, no communication).

Every rank's inputs are a pure function of (shape, world, rank), so any process can rebuild any rank's routing:
the rank checks its own output against the golden, and the global route counts a receiver must see come from
all ranks' routings. Expert e lives on rank e // EXPERTS_PER_RANK (contiguous blocks, as Megatron and DeepEP
place them). Bytes are counted as DeepEP's low-latency test does: a bf16 row is 2H bytes, and the logical
traffic of one dispatch+combine is one row per selected (token, expert) pair each way.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

EXPERTS_PER_RANK = 8
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class MoEShape:
    """One benchmark row's shape: `tokens` per rank (the same on every rank), top-k of 8·world experts."""
    phase: str        # "decode" or "prefill"
    tokens: int
    hidden: int
    top_k: int
    skewed: bool      # True: every token of every rank routes to rank 0's experts (the hot-rank case)

    @property
    def routing(self) -> str:
        return "skewed (all to rank 0)" if self.skewed else "uniform"

    @property
    def label(self) -> str:
        return f"{self.phase} T={self.tokens} H={self.hidden} k={self.top_k}"

    def num_experts(self, world: int) -> int:
        return EXPERTS_PER_RANK * world

    def row_bytes(self) -> int:
        return self.hidden * DTYPE.itemsize


def _both(phase: str, tokens: int, hidden: int, top_k: int) -> tuple[MoEShape, MoEShape]:
    return MoEShape(phase, tokens, hidden, top_k, False), MoEShape(phase, tokens, hidden, top_k, True)


# decode anchors from spec §5.2 C/D (T=8 and T=128, H=4096, top-6); prefill at H=1024, top-8 keeps 8 ranks on
# 2 cores within the bench's time (16 MiB per rank each way)
FULL = _both("decode", 8, 4096, 6) + _both("decode", 128, 4096, 6) + _both("prefill", 1024, 1024, 8)
QUICK = _both("decode", 8, 4096, 6) + _both("prefill", 1024, 1024, 8)[:1]
CHECK = _both("decode", 5, 64, 3) + _both("prefill", 33, 32, 4)   # tiny: correctness only (tests)
PREFILL = _both("prefill", 1024, 1024, 8)    # issue 14's prefill rows alone (`bench.moe_dispatch --set prefill`)
SETS = {"full": FULL, "quick": QUICK, "check": CHECK, "prefill": PREFILL,
        "decode": QUICK[:2], "full-decode": FULL[:4]}


def make_inputs(shape: MoEShape, world: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank `rank`'s x [T, H] bf16, topk_idx [T, k] int64 (k distinct experts per token) and topk_weights [T, k]
    float32 (softmax over k); deterministic in (shape, world, rank)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}/{world}/{rank}".encode()))   # not hash(): salted
    t, k = shape.tokens, shape.top_k
    x = torch.randn(t, shape.hidden, generator=gen).to(DTYPE)
    pool = EXPERTS_PER_RANK if shape.skewed else shape.num_experts(world)   # skewed: rank 0's experts only
    topk_idx = torch.rand(t, pool, generator=gen).topk(k, dim=1).indices
    topk_weights = torch.rand(t, k, generator=gen).softmax(dim=1)
    return x, topk_idx, topk_weights


def expert_fn(rows: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """The check's expert step: each expert multiplies its rows by (global expert id + 1), in the rows' dtype."""
    return rows * (expert_ids + 1).to(rows.dtype).unsqueeze(-1)


def golden(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * expert_fn(x[t], e[t,k]): products in x's dtype (weights rounded to it), summed in
    float32 in increasing expert order and rounded once. That is the baseline's arithmetic (Megatron's unpermute in
    the model dtype: torch 2.13's CPU index_add_ on bf16 accumulates in float32) and order (an expert-sorted
    index_add_), so the baseline matches it bit for bit."""
    experts, order = topk_idx.sort(dim=1, stable=True)
    weights = topk_weights.gather(1, order).to(x.dtype)
    acc = torch.zeros(x.shape, dtype=torch.float32)
    for j in range(topk_idx.shape[1]):
        acc += (expert_fn(x, experts[:, j]) * weights[:, j:j + 1]).float()
    return acc.to(x.dtype)


def route_counts(shape: MoEShape, world: int) -> torch.Tensor:
    """[E] int64: routes to each expert from all ranks (what the experts' owners must receive)."""
    experts = shape.num_experts(world)
    return sum(torch.bincount(make_inputs(shape, world, r)[1].reshape(-1), minlength=experts)
               for r in range(world))


def live_rows(topk_idx: torch.Tensor) -> int:
    """Unique (token, destination rank) pairs: the rows a dispatch that sends a token once per rank moves."""
    if topk_idx.numel() == 0:
        return 0
    dest = topk_idx // EXPERTS_PER_RANK
    return int((torch.nn.functional.one_hot(dest).sum(dim=1) > 0).sum())


def accounting(shape: MoEShape, world: int, rank: int) -> dict:
    """Bytes of one dispatch+combine on `rank`, both directions: logical (DeepEP's), the baseline's wire bytes
    (one row per selected pair each way, plus its [E] int64 counts), live-row bytes, and the baseline's dispatch
    receive buffer (sized to the rows that came)."""
    _, topk_idx, _ = make_inputs(shape, world, rank)
    pairs, row = topk_idx.numel(), shape.row_bytes()
    experts = shape.num_experts(world)
    received = int(route_counts(shape, world).view(world, EXPERTS_PER_RANK)[rank].sum())
    return {"logical": 2 * pairs * row, "baseline_wire": 2 * pairs * row + 8 * experts,
            "live": 2 * live_rows(topk_idx) * row, "baseline_recv": received * row}
