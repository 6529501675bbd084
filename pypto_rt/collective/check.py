"""PYPTO_COMM_CHECK=1: before each collective, ranks compare what they are about to call.

Rank r posts `check/<seq>/<r>` = the call's signature (op, shape, dtype, scalar arguments) to the communicator's
store and waits, with the wait deadline, until every rank has posted for the same sequence number; any difference
is a CollectiveMismatchError naming both ranks and both calls, raised on every rank that sees it, instead of a
hang or silent corruption. A rank that never reaches the collective (rank-divergent control flow) makes the others
time out naming it. Costs a few store round trips per collective, so it is off by default.
"""
from __future__ import annotations

from .base import CollectiveMismatchError
from .store_rendezvous import wait_for_ranks


class CollectiveCheck:
    """Per-communicator sequence of checked calls (collectives are called from one thread per rank)."""

    def __init__(self, store, rank: int, world_size: int, timeout_s: float, watch=None):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s = timeout_s
        self.watch = watch
        self.seq = 0

    def __call__(self, op: str, signature: str, label: str | None = None) -> None:
        seq, self.seq = self.seq, self.seq + 1
        key = f"check/{seq}"
        self.store.set(f"{key}/{self.rank}", signature)
        wait_for_ranks(self.store, key, self.rank, self.world_size, self.timeout_s, op, label, self.watch, hint=(
            f"the ranks listed never reached collective #{seq}: control flow differs across ranks (a collective "
            f"inside a branch on the rank, or a different trip count)"))
        theirs = [v.decode() for v in self.store.multi_get([f"{key}/{r}" for r in range(self.world_size)])]
        for r, other in enumerate(theirs):
            if other != signature:
                label_text = f" (label {label})" if label else ""
                raise CollectiveMismatchError(
                    f"collective #{seq} differs across ranks: rank {self.rank} calls {signature}{label_text} but "
                    f"rank {r} calls {other}",
                    hint="every rank must call the same collectives in the same order with the same shapes and "
                         "dtypes (all_to_all_v: the same row shape)")
        if seq >= 2:   # all ranks read seq-2's keys: each posted seq-1 (which this rank saw) only after doing so
            self.store.delete_key(f"check/{seq - 2}/{self.rank}")
