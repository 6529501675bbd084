"""Copies of a call's tensor arguments for the compiled tier (replay.tier, replay.tier_segments): the inputs a build
is traced on and checked with, so the caller's tensors are never written by a build. Memory shared between
arguments stays shared in the copies; each copy keeps its argument's sizes, strides and offset."""
from __future__ import annotations

import weakref

import torch

from pypto_rt.replay.tier_source import Untierable


class Held:
    """The copies one build holds for its segments' checks: their bytes, counted against tier_max_copy_bytes, and
    the copies themselves, so that a tensor an earlier segment copied and nothing wrote since (the same tensor, its
    torch version counter unchanged) is copied once for all of them: a combine's expert rows, which every one of
    its live sums' segments reads (8-rank skewed decode: 64 MiB each)."""

    def __init__(self):
        self.bytes = 0
        self._copies: dict[int, tuple] = {}   # storage address -> (the tensor copied, weakly; its version; the copy)

    def copied(self, arg: torch.Tensor) -> torch.UntypedStorage | None:
        """The copy of `arg`'s memory made for an earlier segment, if `arg` is the tensor copied then, unwritten."""
        kept = self._copies.get(arg.untyped_storage().data_ptr())
        if kept is None or kept[0]() is not arg or kept[1] != arg._version:
            return None
        return kept[2]

    def keep(self, arg: torch.Tensor, memory: torch.UntypedStorage) -> None:
        self._copies[arg.untyped_storage().data_ptr()] = (weakref.ref(arg), arg._version, memory)


def snapshot(args: list, max_bytes: int, held: Held | None = None, shared: list | None = None) -> list:
    """Copies of the tensor arguments: each memory copied once (arguments sharing memory still share it), each
    argument a view with its own sizes, strides and offset into its copy. `held`: the copies the caller already
    holds for the same build, whose bytes count against `max_bytes` and grow by these; `shared[i]`: whether
    argument i may take (and give) a copy held for an earlier segment: only this process writes it (not a window,
    which peers write under the version counter's nose). Default: every argument."""
    memories: dict[int, torch.UntypedStorage] = {}
    reused: dict[int, torch.UntypedStorage] = {}
    total = 0
    for i, a in enumerate(args):
        if a is None:
            continue
        memory = a.untyped_storage()
        key = memory.data_ptr()
        if key in memories or key in reused:
            continue
        kept = held.copied(a) if held is not None and (shared is None or shared[i]) else None
        if kept is not None:
            reused[key] = kept
            continue
        total += memory.nbytes()
        memories[key] = memory
    before = held.bytes if held is not None else 0
    if before + total > max_bytes:
        also = f", with the {before >> 20} MiB the build's earlier segments hold," if before else ""
        raise Untierable(f"its arguments' memory ({total >> 20} MiB{also}) is over policy.tier_max_copy_bytes to "
                         "copy for the check: kept as a replay")
    copies = {key: memory.clone() for key, memory in memories.items()}
    if held is not None:
        held.bytes += total
        for i, a in enumerate(args):
            key = None if a is None else a.untyped_storage().data_ptr()
            if key in copies and (shared is None or shared[i]):
                held.keep(a, copies[key])
    copies.update(reused)
    return [None if a is None else _view(a, copies[a.untyped_storage().data_ptr()]) for a in args]


def copy(inputs: list) -> list:
    """Fresh copies of a snapshot (sharing kept), so each use starts from the call's inputs."""
    copies: dict[int, torch.UntypedStorage] = {}
    out = []
    for t in inputs:
        if t is None:
            out.append(None)
            continue
        memory = t.untyped_storage()
        fresh = copies.get(memory.data_ptr())
        if fresh is None:
            fresh = copies[memory.data_ptr()] = memory.clone()
        out.append(_view(t, fresh))
    return out


def _view(like: torch.Tensor, memory: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(
        memory, like.storage_offset(), like.size(), like.stride())
