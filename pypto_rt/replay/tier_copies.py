"""Copies of a call's tensor arguments for the compiled tier (replay.tier, replay.tier_segments): the inputs a build
is traced on and checked with, so the caller's tensors are never written by a build. Memory shared between
arguments stays shared in the copies; each copy keeps its argument's sizes, strides and offset."""
from __future__ import annotations

import torch

from pypto_rt.replay.tier_source import Untierable


def snapshot(args: list, max_bytes: int, held: list | None = None) -> list:
    """Copies of the tensor arguments: each memory copied once (arguments sharing memory still share it), each
    argument a view with its own sizes, strides and offset into its copy. `held`: [bytes of copies the caller
    already holds for the same build], counted against `max_bytes` and increased by these."""
    memories: dict[int, torch.UntypedStorage] = {}
    total = 0
    for a in args:
        if a is not None:
            memory = a.untyped_storage()
            if memory.data_ptr() not in memories:
                total += memory.nbytes()
                memories[memory.data_ptr()] = memory
    before = held[0] if held else 0
    if before + total > max_bytes:
        also = f", with the {before >> 20} MiB the build's earlier segments hold," if before else ""
        raise Untierable(f"its arguments' memory ({total >> 20} MiB{also}) is over policy.tier_max_copy_bytes to "
                         "copy for the check: kept as a replay")
    if held:
        held[0] += total
    copies = {key: memory.clone() for key, memory in memories.items()}
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
