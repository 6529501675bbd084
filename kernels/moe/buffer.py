"""`MoEBuffer`: expert-parallel dispatch and combine for one MoE layer shape, across the ranks of a launched job.

    buf = MoEBuffer(cfg)                                   # collective: every rank, in the same order
    recv = buf.dispatch(x, topk_idx, topk_weights)         # x [T, H], T <= max_tokens_per_rank, any T per rank
    y = experts(recv.x, recv.counts)                       # recv.x [E_local, world * T_MAX, H]
    out = buf.combine(y, recv.handle)                      # [T, H] = sum_k w[t, k] * y[route (t, k)]

The kernels and their protocol are in `dispatch.py`. The transport is picked once, at construction, from the
job's communicator: symmetric windows on `shm` (`dispatch.WindowTransport`), collectives on the torch
communicator (`--comm gloo`, nccl, hccl; `dispatch_collective.CollectiveTransport`), with the same results. On
the torch communicator a call is not host-sync free: all_to_all_v takes its split sizes as host lists (as gloo's
and NCCL's all_to_all_single do), so each call reads the row counts into the host, and runs that communicate
this way do not replay.

What this layer adds: the transport's buffers and persistent tensors (allocated once; calls only reuse them, so
on windows a serving loop's steps replay), argument checks that run before any communication (an error names
the rank and the argument; a bad call on one rank would otherwise leave its peers waiting until the timeout
report), and the order rules: dispatch and combine alternate, and a handle serves only the combine of its own
dispatch.

`recv.x` and `recv.counts` are the buffer's own tensors: valid until the next dispatch. Rows past
`recv.counts[e]` in expert e's block are unspecified.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import pypto.language.distributed as pld
from pypto_rt.collective import process
from pypto_rt.collective.torch_backend import TORCH_BACKENDS
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.dispatch import Layout, WindowTransport
from pypto_rt.kernels.moe.dispatch_collective import CollectiveTransport
from pypto_rt.kernels.moe.dispatch_local import LocalTransport
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, MoEConfigError, describe


def _signature(x, topk_idx, topk_weights) -> tuple | None:
    """What the argument checks depend on (types, shapes, dtypes); None when one is not a plain tensor."""
    if type(x) is not torch.Tensor or type(topk_idx) is not torch.Tensor or type(topk_weights) is not torch.Tensor:
        return None
    return x.shape, x.dtype, topk_idx.shape, topk_idx.dtype, topk_weights.shape, topk_weights.dtype


@dataclass(frozen=True)
class DispatchHandle:
    """What a combine needs from its dispatch: the call's number and token count (the routing stays in the
    buffer's tensors and windows until the next dispatch)."""
    call: int
    tokens: int


@dataclass(frozen=True)
class DispatchResult:
    x: torch.Tensor           # [E_local, world * T_MAX, H]: each local expert's rows, packed from row 0
    counts: torch.Tensor      # [E_local] INT32: live rows per local expert
    handle: DispatchHandle


def _transport(layout: Layout, rank: int):
    """COLLECTIVE (the job's communicator starts here): collectives on a torch.distributed communicator (gloo /
    nccl / hccl, which has no windows), else symmetric windows (shm)."""
    if not process.launched() and layout.world == 1:
        return LocalTransport(layout, rank)       # a plain process: no windows, no communicator
    if process.launched() and process.communicator("MoEBuffer").backend in TORCH_BACKENDS:
        return CollectiveTransport(layout, rank)
    return WindowTransport(layout, rank)


class MoEBuffer:
    def __init__(self, cfg: MoEConfig, *, check_routes: bool = True):
        """COLLECTIVE: every rank of the job constructs its buffers in the same order (each allocates windows).
        check_routes: check that expert ids are in range and distinct per token before communicating (a read of
        the routing on the host; turn it off for routing on an accelerator that is known to be valid)."""
        if not isinstance(cfg, MoEConfig):
            raise MoEConfigError(f"MoEBuffer takes an MoEConfig, got {type(cfg).__name__}")
        self.cfg, self.check_routes = cfg, check_routes
        self.rank, world = pld.rank(), pld.world_size()
        try:
            cfg.check_world(world)
        except MoEConfigError as e:
            raise MoEConfigError(f"rank {self.rank}: MoEBuffer: {e.message}", hint=e.hint) from None
        self.layout = layout = Layout(world, cfg.num_experts, cfg.top_k, cfg.max_tokens_per_rank, cfg.hidden,
                                      cfg.dtype)
        lanes, t_max, k = layout.lanes, layout.max_tokens, layout.top_k
        self.transport = _transport(layout, self.rank)   # WindowTransport or CollectiveTransport
        self._recv_rows = torch.zeros(layout.local_experts * lanes + 1, cfg.hidden, dtype=cfg.dtype)
        self._recv_counts = torch.zeros(1, layout.local_experts, dtype=torch.int32)
        self._no_addend = torch.zeros(t_max, cfg.hidden, dtype=cfg.dtype)
        self._route_pos = torch.zeros(t_max, k, dtype=torch.float32)
        self._slots = torch.zeros(t_max, world, dtype=torch.float32)
        self._members = torch.zeros(t_max, world, dtype=torch.float32)
        # the returned views and the per-token-count slices, made once (a torch view costs ~2.5 us; a decode step
        # makes ~10 of them)
        self._recv_x = self._recv_rows[:-1].view(layout.local_experts, lanes, cfg.hidden)
        self._counts_row = self._recv_counts[0]
        self._by_tokens: dict[int, tuple] = {}   # T -> (route_pos, slots, members, no_addend)[:T]
        self._calls = 0
        self._checked: dict[tuple, int] = {}   # argument signature -> token count, checked
        self._open: DispatchHandle | None = None     # the dispatch whose combine has not run yet

    @property
    def world_size(self) -> int:
        return self.layout.world

    @property
    def local_experts(self) -> int:
        return self.layout.local_experts

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> DispatchResult:
        """Send each token once to every rank holding one of its experts; returns this rank's expert rows."""
        if self._open is not None:
            raise self._error("dispatch", f"call {self._open.call}'s combine has not run: dispatch and combine "
                              "alternate on a buffer", "call buf.combine(y, recv.handle) before the next dispatch "
                              "(or use one MoEBuffer per layer in flight)")
        tokens = self._check_tokens(x, topk_idx, topk_weights)
        idx = topk_idx.to(torch.int32).contiguous()
        weights = topk_weights.to(torch.float32).contiguous()
        route_pos, slots, members, _ = self._slices(tokens)
        self.transport.dispatch(x.contiguous(), idx, weights, route_pos, slots, members, self._recv_rows,
                                self._recv_counts)
        self._calls += 1
        self._open = handle = DispatchHandle(self._calls, tokens)
        return DispatchResult(self._recv_x, self._counts_row, handle)

    def combine(self, y: torch.Tensor, handle: DispatchHandle, out: torch.Tensor | None = None,
                add: torch.Tensor | None = None) -> torch.Tensor:
        """Return each token's routes to its rank: out[t] = sum_k topk_weights[t, k] * y[route of (t, k)]
        (+ add[t], e.g. the shared expert's output, summed before the one rounding to the config's dtype)."""
        if not isinstance(handle, DispatchHandle):
            raise self._error("combine", f"handle must be the `recv.handle` of a dispatch, got "
                              f"{type(handle).__name__}")
        if self._open is None:
            raise self._error("combine", f"dispatch call {handle.call}'s combine already ran (a handle serves one "
                              "combine)", "dispatch again, then combine with that call's recv.handle")
        if handle != self._open:
            raise self._error("combine", f"the handle is from dispatch call {handle.call}, but the open dispatch "
                              f"is call {self._open.call}", "pass the recv.handle of this buffer's latest dispatch")
        layout, cfg = self.layout, self.cfg
        shape = [layout.local_experts, layout.lanes, cfg.hidden]
        if not isinstance(y, torch.Tensor) or list(y.shape) != shape or y.dtype != cfg.dtype:
            raise self._error("combine", f"y must be {cfg.dtype} {shape} (shaped like recv.x), got {describe(y)}")
        tokens = handle.tokens
        if out is None:
            out = torch.empty(tokens, cfg.hidden, dtype=cfg.dtype)
        elif list(out.shape) != [tokens, cfg.hidden] or out.dtype != cfg.dtype or not out.is_contiguous():
            raise self._error("combine", f"out must be a contiguous {cfg.dtype} [{tokens}, {cfg.hidden}], got "
                              f"{describe(out)}")
        _, slots, members, no_addend = self._slices(tokens)
        if add is None:
            add = no_addend
        elif list(add.shape) != [tokens, cfg.hidden] or add.dtype != cfg.dtype:
            raise self._error("combine", f"add must be {cfg.dtype} [{tokens}, {cfg.hidden}], got {describe(add)}")
        self.transport.combine(y.reshape(layout.local_experts * layout.lanes, cfg.hidden), slots, members,
                               add.contiguous(), out)
        self._open = None
        return out

    def sent_rows(self) -> list[int]:
        """Token rows this rank's latest dispatch sent to each rank (one per token and destination rank; the
        combine sends as many back). Reads the buffer's counts: call it for statistics, not in the hot loop."""
        return self.transport.sent_rows(self.rank)

    def _slices(self, tokens: int) -> tuple:
        """The buffer's per-token tensors cut to `tokens` rows (route_pos, slots, members, no_addend), made once
        per token count."""
        cut = self._by_tokens.get(tokens)
        if cut is None:
            cut = self._by_tokens[tokens] = (self._route_pos[:tokens], self._slots[:tokens], self._members[:tokens],
                                             self._no_addend[:tokens])
        return cut

    # ------------------------------------------------------------------------------------------- checks
    def _check_tokens(self, x, topk_idx, topk_weights) -> int:
        """The call's token count, its arguments checked: their types, shapes and dtypes once per signature (a decode
        loop repeats a few), the expert ids (data) on every call unless check_routes=False."""
        key = _signature(x, topk_idx, topk_weights)
        tokens = self._checked.get(key) if key is not None else None
        if tokens is None:
            tokens = self._check_arguments(x, topk_idx, topk_weights)
            if key is not None:
                self._checked[key] = tokens
        if self.check_routes and tokens:
            self._check_expert_ids(topk_idx)
        return tokens

    def _check_arguments(self, x, topk_idx, topk_weights) -> int:
        cfg = self.cfg
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != cfg.hidden:
            raise self._error("dispatch", f"x must be a [T, {cfg.hidden}] tensor (hidden={cfg.hidden}), got "
                              f"{describe(x)}")
        if x.dtype != cfg.dtype:
            raise self._error("dispatch", f"x is {x.dtype}, the config's dtype is {cfg.dtype}",
                              f"cast x with x.to({cfg.dtype}) or build the MoEConfig with dtype={x.dtype}")
        tokens = x.shape[0]
        if tokens > cfg.max_tokens_per_rank:
            raise self._error("dispatch", f"x has {tokens} tokens, over max_tokens_per_rank="
                              f"{cfg.max_tokens_per_rank}", "split the batch or raise max_tokens_per_rank")
        routes = [tokens, cfg.top_k]
        if not isinstance(topk_idx, torch.Tensor) or list(topk_idx.shape) != routes or \
                topk_idx.is_floating_point() or topk_idx.dtype == torch.bool:
            raise self._error("dispatch", f"topk_idx must be an integer [T, top_k] = {routes} tensor, got "
                              f"{describe(topk_idx)}")
        if not isinstance(topk_weights, torch.Tensor) or list(topk_weights.shape) != routes or \
                not topk_weights.is_floating_point():
            raise self._error("dispatch", f"topk_weights must be a floating-point {routes} tensor, got "
                              f"{describe(topk_weights)}")
        return tokens

    def _check_expert_ids(self, topk_idx: torch.Tensor) -> None:
        """Ids in 0..E-1 and distinct per token: a min/max, and a count of the equal pairs among a token's routes
        (only each route with itself when distinct: [T, K, K] compares, 22 against a sort's 44 us a decode call,
        T=8 top-6; 50 us more at T=1024 top-8, against a ~40 ms call); the error path finds the first offending
        route."""
        lo, hi = (int(v) for v in torch.aminmax(topk_idx))
        if lo >= 0 and hi < self.cfg.num_experts:
            if topk_idx.shape[1] < 2 or int((topk_idx.unsqueeze(2) == topk_idx.unsqueeze(1)).sum()) == \
                    topk_idx.numel():
                return
        self._route_error(topk_idx)

    def _route_error(self, topk_idx: torch.Tensor) -> None:
        experts = self.cfg.num_experts
        bad = (topk_idx < 0) | (topk_idx >= experts)
        if bool(bad.any()):
            t, k = (int(i) for i in bad.nonzero()[0])
            raise self._error("dispatch", f"topk_idx[{t}, {k}] = {int(topk_idx[t, k])} is not an expert id "
                              f"(num_experts={experts}: ids 0..{experts - 1})")
        ordered = topk_idx.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
        if bool(repeated.any()):
            t = int(repeated.nonzero()[0])
            experts = topk_idx[t].tolist()
            twice = next(e for e in experts if experts.count(e) > 1)
            raise self._error("dispatch", f"token {t} routes to expert {twice} more than once (topk_idx[{t}] = "
                              f"{experts})", "a token's top_k experts must be distinct (as torch.topk picks them)")

    def _error(self, method: str, message: str, hint: str | None = None) -> MoEArgumentError:
        return MoEArgumentError.at_caller(f"rank {self.rank}: MoEBuffer.{method}: {message}", hint)
