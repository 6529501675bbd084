"""The benchmark's denominator: Megatron-style MoE dispatch+combine on torch.distributed (gloo on CPU).

As Megatron-core's all-to-all token dispatcher does it: rows are expanded per selected (token, expert) and sorted
by expert (so by destination rank, experts being contiguous per rank); one all_to_all_single exchanges the [E]
per-expert counts (a receiver learns how many rows of each of its local experts every source sends); the host
reads the split sizes; the payload goes by all_to_all_single with those splits (as raw uint8 rows, which gloo
takes whatever the dtype); combine is the reverse exchange and a weighted index_add_ back to [T, H], in the
tokens' dtype as Megatron-core's unpermute does by default (a float32 sum costs ~4x more on CPU at prefill).

Host reads per call: 2 (the send and the receive split sizes, `.tolist()`), counted in `host_reads`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

HOST_READS_PER_CALL = 2


@dataclass
class BaselineHandle:
    """What combine needs of its dispatch: the expert-sorted (token, weight) of each sent row, and the splits."""
    tokens: torch.Tensor          # [T*k] the token of each sent row, in send order
    weights: torch.Tensor         # [T*k] its combine weight (as given)
    send_splits: list[int]        # rows sent to each rank
    recv_splits: list[int]        # rows received from each rank
    num_tokens: int


@dataclass
class BaselineRecv:
    x: torch.Tensor               # [N, H] received rows: source-rank major, then by local expert
    local_expert: torch.Tensor    # [N] int64 local expert id of each row
    handle: BaselineHandle


def _as_bytes(rows: torch.Tensor) -> torch.Tensor:
    """[N, H] rows as [N, H * itemsize] uint8 (a view): gloo moves bytes, and splits stay in rows."""
    return rows.contiguous().view(torch.uint8)


class GlooDispatch:
    """Dispatch and combine over the default torch.distributed process group; `experts_per_rank` experts each."""

    def __init__(self, experts_per_rank: int, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.experts_per_rank = experts_per_rank
        self.host_reads = 0

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> BaselineRecv:
        k = topk_idx.shape[1]
        flat = topk_idx.reshape(-1).long()
        order = torch.argsort(flat, stable=True)     # expert-major; tokens ascending within an expert
        counts = torch.bincount(flat, minlength=self.world * self.experts_per_rank)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)   # [world, E_l] after the exchange
        send_splits = counts.view(self.world, -1).sum(dim=1).tolist()
        recv_splits = recv_counts.view(self.world, -1).sum(dim=1).tolist()
        self.host_reads += HOST_READS_PER_CALL
        tokens = order // k
        send = x.index_select(0, tokens)
        recv = torch.empty(sum(recv_splits), x.shape[1], dtype=x.dtype)
        dist.all_to_all_single(_as_bytes(recv), _as_bytes(send), recv_splits, send_splits, group=self.group)
        local_ids = torch.arange(self.experts_per_rank).repeat(self.world)
        local_expert = torch.repeat_interleave(local_ids, recv_counts, output_size=recv.shape[0])
        handle = BaselineHandle(tokens, topk_weights.reshape(-1)[order], send_splits, recv_splits,
                                x.shape[0])
        return BaselineRecv(recv, local_expert, handle)

    def combine(self, y: torch.Tensor, handle: BaselineHandle) -> torch.Tensor:
        """[T, H] in y's dtype: sum over each token's rows of weight * row. As Megatron-core's unpermute by
        default (router dtype = model dtype): weights in y's dtype, multiplied and added up in it."""
        back = torch.empty(sum(handle.send_splits), y.shape[1], dtype=y.dtype)
        dist.all_to_all_single(_as_bytes(back), _as_bytes(y), handle.send_splits, handle.recv_splits,
                               group=self.group)
        out = torch.zeros(handle.num_tokens, y.shape[1], dtype=y.dtype)
        return out.index_add_(0, handle.tokens, back * handle.weights.to(y.dtype).unsqueeze(1))

    def global_expert(self, recv: BaselineRecv) -> torch.Tensor:
        """[N] global expert id of each received row."""
        return recv.local_expert + dist.get_rank(self.group) * self.experts_per_rank
