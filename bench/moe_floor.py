"""The floor of MoE dispatch+combine on this machine (issue 14's speed work): the MoEBuffer protocol written
directly in eager torch over the same shm windows, no DSL, no replay. A reference for what the library's calls
could cost, not a contender: it reads its row counts into Python (`.tolist()`), which the library must not.

    .venv/bin/pypto-launch --nproc 2 bench/moe_floor.py [--tokens 8 --hidden 4096 --top-k 6 --iters 50]

One protocol round per direction, as DeepEP's low-latency kernels do: each source owns a fixed block of
T_MAX rows in every receiver's windows, so a dispatch needs no count exchange before its payload; the count
row, the token rows (each once per destination rank) and their meta rows go in one round, then one signal.
The receiver packs each expert's rows from its arrivals; combine weights and sums each arrival's routes on the
expert's rank (one batched matmul), returns one row per (token, rank) and sums them at the source. Rank 0
prints the median per call and whether out equals sum_k w[t, k] * x[t] (the identity expert).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.collective import process
from bench.moe_routing import EXPERTS_PER_RANK, MoEShape, make_inputs

DISPATCHED, COMBINED = 0, 1


class FloorBuffer:
    """Windows: counts [W, E_LOCAL + 1] int32 (per source: routes per local expert, then tokens sent), tokens /
    back [W * T_MAX, H] bf16, meta [W * T_MAX, 2K] fp32 (per route slot: the local expert, -1 elsewhere, then
    its weight), signals [W, 2] int32 (epochs: a cell only grows, so nothing is ever cleared)."""

    def __init__(self, world: int, rank: int, t_max: int, hidden: int, top_k: int):
        self.world, self.rank, self.t_max, self.hidden, self.k = world, rank, t_max, hidden, top_k
        self.lanes = lanes = world * t_max
        self.counts = self._alloc([world, EXPERTS_PER_RANK + 1], pl.INT32)
        self.tokens = self._alloc([lanes, hidden], pl.BF16)
        self.meta = self._alloc([lanes, 2 * top_k], pl.FP32)
        self.back = self._alloc([lanes, hidden], pl.BF16)
        self.signals = self._alloc([world, 2], pl.INT32)
        self.epoch = 0
        self.recv = torch.zeros(EXPERTS_PER_RANK * lanes + 1, hidden, dtype=torch.bfloat16)   # + a spill row

    @staticmethod
    def _alloc(shape, dtype):
        view = pld.window(pld.alloc_window_buffer(shape, dtype), shape, dtype)
        return view, process.window_of(view)[0]

    @staticmethod
    def _peer(window, peer: int) -> torch.Tensor:
        """Rank `peer`'s copy of one of the windows above, mapped in this process."""
        view, buf = window
        return buf.window.peer(peer)[:view.numel() * view.element_size()].view(view.dtype).view(view.shape)

    def _signal_all(self, column: int) -> None:
        _, buf = self.signals
        for peer in range(self.world):
            buf.comm.notify(buf.window, peer, (self.rank * 2 + column) * 4, self.epoch, "set")
        for src in range(self.world):
            buf.comm.wait(buf.window, (src * 2 + column) * 4, self.epoch, "ge", label="moe_floor")

    def dispatch(self, x, idx, w):
        self.epoch += 1
        me, t_max, e_local = self.rank, self.t_max, EXPERTS_PER_RANK
        owner = idx // e_local
        for d in range(self.world):
            goes = (owner == d).any(dim=1).nonzero().flatten()
            n, mine = goes.numel(), owner[goes] == d
            local = torch.where(mine, idx[goes] % e_local, -1)
            count = torch.bincount(local[mine], minlength=e_local)
            self._peer(self.counts, d)[me] = torch.cat([count, torch.tensor([n])])
            self._peer(self.tokens, d)[me * t_max:me * t_max + n] = x[goes]
            self._peer(self.meta, d)[me * t_max:me * t_max + n] = torch.cat([local.float(),
                                                                            torch.where(mine, w[goes], 0.0)], 1)
        self._signal_all(DISPATCHED)
        return self._expand()

    def _expand(self):
        """Each arrived route's row in the receive layout (expert e's rows from e * LANES, in (rank, token)
        order), then one gather of the arrived tokens into them."""
        lanes, k, e_local = self.lanes, self.k, EXPERTS_PER_RANK
        counts = self.counts[0]
        arrived = torch.arange(self.t_max).view(1, -1) < counts[:, e_local:]          # [W, T_MAX]
        expert = self.meta[0][:, :k].long().view(self.world, self.t_max, k)
        live = ((expert >= 0) & arrived.unsqueeze(-1)).view(lanes * k)
        onehot = torch.nn.functional.one_hot(expert.clamp(min=0).view(-1), e_local) * live.unsqueeze(-1)
        before = onehot.cumsum(0) - onehot                                             # earlier routes, per expert
        slot = (before * onehot).sum(-1) + expert.clamp(min=0).view(-1) * lanes
        target = torch.where(live, slot, e_local * lanes)
        self.slot_rows = torch.where(live, slot, slot.view(lanes, k).max(1, keepdim=True).values.expand(
            lanes, k).reshape(-1)).clamp(max=e_local * lanes - 1)
        self.slot_live = live.view(lanes, k)
        self.recv.index_copy_(0, target, self.tokens[0].repeat_interleave(k, dim=0))
        return self.recv[:-1].view(e_local, lanes, self.hidden), counts[:, :e_local].sum(0)

    def combine(self, y, idx):
        me, t_max, k, lanes = self.rank, self.t_max, self.k, self.lanes
        weights = torch.where(self.slot_live, self.meta[0][:, k:], 0.0).view(lanes, 1, k)
        picked = y.reshape(-1, self.hidden).index_select(0, self.slot_rows).view(lanes, k, self.hidden)
        sums = torch.bmm(weights, picked.float()).view(lanes, self.hidden).to(torch.bfloat16)
        arrivals = self.counts[0][:, EXPERTS_PER_RANK].tolist()
        for s in range(self.world):
            self._peer(self.back, s)[me * t_max:me * t_max + arrivals[s]] = sums[s * t_max:s * t_max + arrivals[s]]
        self._signal_all(COMBINED)
        owner = idx // EXPERTS_PER_RANK
        member = torch.stack([(owner == d).any(dim=1) for d in range(self.world)], dim=1)    # [T, W]
        rows = (member.cumsum(0) - member.int()) + torch.arange(self.world) * t_max
        rows = torch.where(member, rows, rows.max(1, keepdim=True).values)    # a member's row, weight 0
        back = self.back[0].index_select(0, rows.view(-1)).view(-1, self.world, self.hidden)
        return torch.bmm(member.float().unsqueeze(1), back.float()).squeeze(1).to(torch.bfloat16)


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/moe_floor.py", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = pld.rank(), pld.world_size()
    shape = MoEShape("decode", args.tokens, args.hidden, args.top_k, False)
    x, idx, w = make_inputs(shape, world, rank)
    floor = FloorBuffer(world, rank, args.tokens, args.hidden, args.top_k)
    seconds = []
    for i in range(args.iters + 5):
        start = time.perf_counter()
        recv_x, _ = floor.dispatch(x, idx, w)
        out = floor.combine(recv_x, idx)          # the identity expert
        if i >= 5:
            seconds.append(time.perf_counter() - start)
    want = (x.float() * w.sum(dim=1, keepdim=True)).to(torch.bfloat16)
    ok = torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    print(f"rank {rank}: floor dispatch+combine median {statistics.median(seconds) * 1e3:.3f} ms over "
          f"{len(seconds)} calls ({shape.label}, {world} ranks); output {'matches' if ok else 'DIFFERS'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
