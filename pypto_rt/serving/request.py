"""A request's state across steps: its tokens, how many have their K/V in the cache, its blocks and its row.

Token bookkeeping (one rule for prefill, chunked prefill, decode and resumption after preemption):
`token_ids` = prompt + generated tokens; the first `num_computed_tokens` have K/V in the cache; a step feeds
`token_ids[num_computed_tokens : num_computed_tokens + n]`. When a step reaches the end of `token_ids`, the
model's token for the request is appended (a decode step is the case n == 1). Preemption by recompute frees the
blocks and sets num_computed_tokens to 0; the request then prefills prompt + generated tokens again.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pypto_rt.serving.block_pool import BlockHash, KVBlock, hash_block_tokens


class RequestStatus(enum.Enum):
    WAITING = "waiting"      # queued, or preempted and queued again; holds no block
    RUNNING = "running"      # holds blocks and a batch row
    FINISHED = "finished"    # reached max_new_tokens or its eos id; holds nothing


@dataclass(eq=False)
class Request:
    request_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    eos_id: int | None = None
    arrival_time: float = 0.0
    token_ids: list[int] = field(default_factory=list)        # prompt + output, filled in __post_init__
    num_computed_tokens: int = 0
    blocks: list[KVBlock] = field(default_factory=list)      # logical block i -> physical block
    block_hashes: list[BlockHash] = field(default_factory=list)   # hashes of the full blocks of token_ids
    num_cached_blocks: int = 0                               # leading blocks already recorded in the pool's map
    row: int = -1                                            # batch row while RUNNING
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    num_prefix_hit_tokens: int = 0                           # prompt tokens found in the cache on admission
    first_token_time: float | None = None
    finish_time: float | None = None

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)
        self.max_total_tokens = len(self.prompt_ids) + self.max_new_tokens    # token_ids' length when done

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_pending(self) -> int:
        """Tokens not yet in the cache (1 for a request in decode)."""
        return len(self.token_ids) - self.num_computed_tokens

    def full_block_hashes(self, block_size: int) -> list[BlockHash]:
        """The chained hashes of every full block of token_ids, extended incrementally."""
        hashes = self.block_hashes
        for i in range(len(hashes), len(self.token_ids) // block_size):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, self.token_ids[i * block_size:(i + 1) * block_size]))
        return hashes
