"""Host collectives of the shm communicator: stage, one barrier, read peers' staging directly.

Each rank owns two staging segments (halves); collective number k uses half k % 2. Rank r writes its half-h
staging only in collective k, and again no earlier than collective k + 2, i.e. after the barrier of collective
k + 1, which no rank passes before every rank has finished reading collective k's data. So one barrier per
collective suffices (no read-done barrier). A staging half too small for a call is replaced by a larger segment
(generation+1, published in the rank's control cell GEN+h before the barrier); the old one is unlinked at once,
because its last readers finished with collective k - 2 and nobody opens it again (peers drop their mapping when
they see the new generation).

Reductions run in rank order 0..W-1 on every rank, so every rank gets the same bits; float16/bfloat16 sums
accumulate in float32. A large allreduce of 3+ ranks is a reduce-scatter then an allgather: rank r reduces chunk
r into its own staging (peers only read their own chunks of it meanwhile), a second barrier, then every rank
copies every chunk; each chunk is computed once, so the bits still agree. (At 2 ranks the direct reduction moves
fewer bytes; measured, it wins.) Exchanges with per-peer pieces (reduce_scatter, all_to_all(_v)) stage only the
pieces for peers, behind a table of (offset, bytes) per destination; a rank's own piece is copied straight from
its input, while peers may still be staging.
"""
from __future__ import annotations

import torch

from pypto_rt.errors import PyptoError

from .base import (check_all_to_all, check_all_to_all_v, check_allgather, check_reduce_scatter, check_src,
                   reduce_op, signature)
from .control import GEN
from .segments import Segment

_HEADER_ALIGN = 64
SPLIT_BYTES = 256 << 10   # allreduce of 3+ ranks from this size on: each rank reduces 1/W, then all gather
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _reduce_into(out: torch.Tensor, parts: list[torch.Tensor], op: str) -> None:
    """out = parts[0] op parts[1] op ... in this order (parts never alias out)."""
    if len(parts) == 1:
        out.copy_(parts[0])
        return
    if op == "sum":
        if out.dtype in _LOW_PRECISION:
            acc = parts[0].float()
            for p in parts[1:]:
                acc.add_(p)
            out.copy_(acc)
            return
        torch.add(parts[0], parts[1], out=out)
        for p in parts[2:]:
            out.add_(p)
        return
    fn = torch.maximum if op == "max" else torch.minimum
    fn(parts[0], parts[1], out=out)
    for p in parts[2:]:
        fn(out, p, out=out)


class StagedCollectives:
    """Mixin of ShmCommunicator: needs rank, world_size, base_name, _ctl, _peer_ctl, _attach, _barrier,
    _precheck."""

    def _init_staging(self) -> None:
        w = self.world_size
        self._header = -(-8 * (1 + 2 * w) // _HEADER_ALIGN) * _HEADER_ALIGN   # the exchange table
        self._stages: list[Segment | None] = [None, None]
        self._stage_gen = [0, 0]
        self._peer_stages: list[list[tuple[int, Segment] | None]] = [[None] * w, [None] * w]
        self._calls = 0

    # -------------------------------------------------------------------------------------- staging
    def _own_stages(self) -> list[Segment]:
        return [s for s in self._stages if s is not None]

    def _peer_stage_segments(self) -> list[Segment]:
        return [entry[1] for half in self._peer_stages for entry in half if entry is not None]

    def _next_half(self) -> int:
        self._calls += 1
        return self._calls % 2

    def _stage(self, nbytes: int) -> tuple[int, Segment]:
        """(half, this rank's staging segment of the next collective, at least header + nbytes)."""
        h = self._next_half()
        seg, need = self._stages[h], self._header + nbytes
        if seg is None or seg.size < need:
            gen = self._stage_gen[h] + 1
            new = Segment.create(f"{self.base_name}-s{h}g{gen}-r{self.rank}",
                                 max(need, 2 * seg.size if seg else 0, 1 << 16), self.rank)
            if seg is not None:
                seg.release(unlink=True)   # safe: see the module docstring
            self._stages[h], self._stage_gen[h] = new, gen
            self._ctl.cells64[GEN + h] = gen
            seg = new
        return h, seg

    def _peer_stage(self, r: int, h: int) -> Segment:
        if r == self.rank:
            return self._stages[h]
        gen = self._peer_ctl[r].cells64[GEN + h]
        entry = self._peer_stages[h][r]
        if entry is None or entry[0] != gen:
            if entry is not None:
                entry[1].release()
            entry = (gen, self._attach(f"{self.base_name}-s{h}g{gen}-r{r}", r))
            self._peer_stages[h][r] = entry
        return entry[1]

    def _data(self, seg: Segment, like: torch.Tensor, byte_offset: int = 0, numel: int | None = None):
        """A flat view of `numel` elements of like's dtype in seg's data area (after the header)."""
        n = like.numel() if numel is None else numel
        start = self._header + byte_offset
        return seg.tensor[start:start + n * like.element_size()].view(like.dtype)

    def _peers_data(self, h: int, like: torch.Tensor, numel: int | None = None, byte_offset: int = 0):
        return [self._data(self._peer_stage(r, h), like, byte_offset, numel) for r in range(self.world_size)]

    # -------------------------------------------------------------------------------------- collectives
    def allreduce(self, tensor: torch.Tensor, op="sum", *, label: str | None = None) -> torch.Tensor:
        op = reduce_op(op)
        call = signature("allreduce", tensor, op=op)
        self._precheck("allreduce", call, label)
        n, nbytes, w, me = tensor.numel(), _nbytes(tensor), self.world_size, self.rank
        h, seg = self._stage(nbytes)
        staged = self._data(seg, tensor)
        staged.copy_(_flat(tensor))
        self._barrier("allreduce", label, nbytes, call)
        result = tensor.view(-1) if tensor.is_contiguous() else torch.empty(n, dtype=tensor.dtype)
        if nbytes < SPLIT_BYTES or w <= 2:   # every rank reduces everything (one barrier)
            _reduce_into(result, self._peers_data(h, tensor), op)
        else:                                # reduce-scatter, then allgather, both through the staging
            bounds = [n * r // w for r in range(w + 1)]
            a, b = bounds[me], bounds[me + 1]
            _reduce_into(result[a:b], [self._data(self._peer_stage(r, h), tensor)[a:b] for r in range(w)], op)
            staged[a:b].copy_(result[a:b])   # peers read only their own chunks of this staging meanwhile
            self._barrier("allreduce", label, nbytes, call)
            for r in range(w):
                if r != me:
                    lo, hi = bounds[r], bounds[r + 1]
                    result[lo:hi].copy_(self._data(self._peer_stage(r, h), tensor)[lo:hi])
        if not tensor.is_contiguous():
            tensor.copy_(result.view(tensor.shape))
        return tensor

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, *, label: str | None = None) -> torch.Tensor:
        check_allgather(self, out, inp)
        call = signature("allgather", inp)
        self._precheck("allgather", call, label)
        h, seg = self._stage(_nbytes(inp))
        self._data(seg, inp).copy_(_flat(inp))
        out[self.rank].copy_(inp)   # while peers may still be staging
        self._barrier("allgather", label, _nbytes(inp), call)
        for r in range(self.world_size):
            if r != self.rank:
                out[r].copy_(self._data(self._peer_stage(r, h), inp).view(inp.shape))
        return out

    def _exchange(self, op: str, call: str, label, check_bytes: int, pieces: list, item_bytes: int,
                  local=None) -> int:
        """Stage pieces[p] (flat tensors) for every peer p != this rank, with a table of where each starts;
        run `local()` (this rank's own piece, which never goes through staging) while peers may still be
        staging; one barrier; returns the staging half."""
        me = self.rank
        h, seg = self._stage(sum(_nbytes(t) for p, t in enumerate(pieces) if p != me))
        table, offset = seg.cells64, 0
        table[0] = item_bytes
        for p, t in enumerate(pieces):
            n = 0 if p == me else _nbytes(t)
            if n:
                start = self._header + offset
                seg.tensor[start:start + n].view(t.dtype).copy_(t)
            table[1 + 2 * p], table[2 + 2 * p] = offset, n
            offset += n
        if local is not None:
            local()
        self._barrier(op, label, check_bytes, call)
        return h

    def _piece(self, h: int, r: int, dtype) -> tuple[torch.Tensor, int, int]:
        """(rank r's piece for this rank as a flat `dtype` view, its bytes, r's item bytes)."""
        seg = self._peer_stage(r, h)
        table = seg.cells64
        start, n = self._header + table[1 + 2 * self.rank], table[2 + 2 * self.rank]
        return seg.tensor[start:start + n].view(dtype), n, table[0]

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op="sum", *,
                       label: str | None = None) -> torch.Tensor:
        op = reduce_op(op)
        check_reduce_scatter(self, out, inp)
        call = signature("reduce_scatter", inp, op=op)
        self._precheck("reduce_scatter", call, label)
        m, flat = out.numel(), _flat(inp)
        mine = [flat[p * m:(p + 1) * m] for p in range(self.world_size)]
        h = self._exchange("reduce_scatter", call, label, _nbytes(inp), mine, out.element_size())
        parts = [mine[r] if r == self.rank else self._piece(h, r, out.dtype)[0] for r in range(self.world_size)]
        tmp = out.view(-1) if out.is_contiguous() else torch.empty(m, dtype=out.dtype)
        _reduce_into(tmp, parts, op)
        if not out.is_contiguous():
            out.copy_(tmp.view(out.shape))
        return out

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, *, label: str | None = None) -> torch.Tensor:
        check_all_to_all(self, out, inp)
        call = signature("all_to_all", inp)
        self._precheck("all_to_all", call, label)
        rows = inp.shape[0] // self.world_size
        chunks = [inp[p * rows:(p + 1) * rows] for p in range(self.world_size)]
        me = self.rank
        h = self._exchange("all_to_all", call, label, _nbytes(inp), [_flat(c) for c in chunks], out.element_size(),
                           lambda: out[me * rows:(me + 1) * rows].copy_(chunks[me]))
        for r in range(self.world_size):
            if r != me:
                out[r * rows:(r + 1) * rows].copy_(self._piece(h, r, inp.dtype)[0].view(chunks[r].shape))
        return out

    def all_to_all_v(self, out: torch.Tensor, inp: torch.Tensor, send_counts, recv_counts, *,
                     label: str | None = None) -> torch.Tensor:
        send, recv = check_all_to_all_v(self, out, inp, send_counts, recv_counts)
        row_shape = tuple(inp.shape[1:])
        call = signature("all_to_all_v", inp, shape=("*", *row_shape))
        self._precheck("all_to_all_v", call, label)
        row_bytes = _nbytes(inp[:1]) if inp.shape[0] else 0
        starts = [sum(send[:p]) for p in range(self.world_size)]
        pieces = [inp[s:s + n] for s, n in zip(starts, send)]             # only the live rows
        me, mine_at = self.rank, sum(recv[:self.rank])
        h = self._exchange("all_to_all_v", call, label, -1, [_flat(p) for p in pieces], row_bytes,
                           lambda: out[mine_at:mine_at + send[me]].copy_(pieces[me]))
        at = 0
        for r in range(self.world_size):
            if r == me:
                at += send[r]
                continue
            rows, n, their_row_bytes = self._piece(h, r, inp.dtype)
            if n != recv[r] * row_bytes or (n and their_row_bytes != row_bytes):
                raise PyptoError(
                    f"rank {self.rank}: all_to_all_v expects {recv[r]} rows of {row_bytes} bytes from rank {r}, "
                    f"but rank {r} sends {n // max(their_row_bytes, 1)} rows of {their_row_bytes} bytes",
                    hint="recv_counts[r] on this rank must equal send_counts[this rank] on rank r")
            if n:
                out[at:at + recv[r]].copy_(rows.view((recv[r], *row_shape)))
            at += recv[r]
        return out

    def broadcast(self, tensor: torch.Tensor, src: int, *, label: str | None = None) -> torch.Tensor:
        src = check_src(self, src, "broadcast")
        call = signature("broadcast", tensor, src=src)
        self._precheck("broadcast", call, label)
        if self.rank == src:
            h, seg = self._stage(_nbytes(tensor))
            self._data(seg, tensor).copy_(_flat(tensor))
        else:
            h = self._next_half()   # only the source stages
        self._barrier("broadcast", label, _nbytes(tensor), call)
        if self.rank != src:
            tensor.copy_(self._data(self._peer_stage(src, h), tensor).view(tensor.shape))
        return tensor
