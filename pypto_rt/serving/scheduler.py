"""Continuous batching: which requests run this step and how many tokens each feeds, under a token budget.

Each step (vLLM v1's policy, one rank):
1. running requests, in row order: a request in decode feeds 1 token; one still prefilling feeds a chunk of
   what the budget leaves after reserving 1 token for every decode row after it. A request whose blocks cannot
   be allocated preempts the last running row (recompute: its blocks are freed, it returns to the front of the
   waiting queue and later prefills prompt + generated tokens again, prefix hits included) and retries; when it
   is itself the last row it is preempted;
2. waiting requests, first come first served, while the budget, the batch rows and the pool allow (none after
   a preemption in the same step): prefix-cache lookup, then a first chunk.
A running request left without tokens (the budget went to earlier rows) is a row with 0 tokens: it reads and
writes nothing this step. A step with no row is still a step: in expert parallelism every rank calls the model
each step (B = T = 0 on a rank with nothing to run), because MoE's dispatch is collective.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from pypto_rt.serving.block_manager import KVCacheManager
from pypto_rt.serving.request import Request, RequestStatus
from pypto_rt.serving.serving_errors import ServingConfigError


@dataclass
class ScheduledStep:
    """One step's work: `rows[r]` = (request in batch row r, tokens it feeds; 0 = idle row this step)."""
    rows: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_tokens: int = 0              # tokens fed in all (T before padding)
    num_live_rows: int = 0           # rows feeding at least one token
    is_decode: bool = False          # every row feeds exactly one token (T == B): paged decode attention's shape

    @property
    def is_empty(self) -> bool:
        return not self.rows


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int):
        if max_num_batched_tokens < kv.max_batch:
            raise ServingConfigError(
                f"max_num_batched_tokens {max_num_batched_tokens} is below max_batch {kv.max_batch}: a full batch "
                f"of decodes would not fit in one step", hint="raise max_num_batched_tokens or lower max_batch")
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: collections.deque[Request] = collections.deque()

    @property
    def running(self) -> list[Request]:
        return self.kv.rows

    def add(self, req: Request) -> None:
        self.kv.check_fits(req)
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.kv.rows)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        tokens = self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step, self.max_num_batched_tokens - sum(tokens.values()), tokens)
        step.rows = [(req, tokens.get(req, 0)) for req in self.kv.rows]
        step.num_tokens, step.num_live_rows = sum(tokens.values()), len(tokens)     # every value is >= 1
        step.is_decode = bool(step.rows) and len(tokens) == len(step.rows) == step.num_tokens
        return step

    def _schedule_running(self, step: ScheduledStep) -> dict[Request, int]:
        if all(len(req.token_ids) == req.num_computed_tokens + 1 for req in self.kv.rows):
            return self._schedule_decodes(step)
        decodes_after = sum(1 for req in self.kv.rows if req.num_pending == 1)
        tokens: dict[Request, int] = {}
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.kv.rows):
            req = self.kv.rows[i]
            i += 1
            if req.num_pending == 1:
                decodes_after -= 1
                n = 1
            else:
                n = min(req.num_pending, budget - decodes_after)
                if n <= 0:
                    continue
            while not self.kv.allocate(req, n):
                victim = self.kv.rows[-1]     # not scheduled yet: rows are visited in order
                if victim is not req and victim.num_pending == 1:
                    decodes_after -= 1
                self._preempt(victim, step)
                if victim is req:
                    break
            if req.status is RequestStatus.RUNNING:
                tokens[req] = n
                budget -= n
        return tokens

    def _schedule_decodes(self, step: ScheduledStep) -> dict[Request, int]:
        """Every running request decodes (the steady state): only rows whose token falls past their last block
        allocate; preemption takes the last rows, so the rows still to visit keep their indices."""
        rows = self.kv.rows
        needing = self.kv.rows_needing_blocks(self.kv.decode_positions())
        if self.kv.grow_rows(needing):       # the pool has room for all of them (the common case)
            return dict.fromkeys(rows, 1)
        for r in needing:
            if r >= len(rows):
                break
            req = rows[r]
            while not self.kv.allocate(req, 1):
                victim = rows[-1]
                self._preempt(victim, step)
                if victim is req:
                    break
        return dict.fromkeys(rows, 1)

    def _schedule_waiting(self, step: ScheduledStep, budget: int, tokens: dict[Request, int]) -> None:
        while self.waiting and budget > 0 and len(self.kv.rows) < self.kv.max_batch:
            req = self.waiting[0]
            prefix = self.kv.lookup_prefix(req)
            n = min(req.num_tokens - len(prefix) * self.kv.block_size, budget)
            if not self.kv.allocate(req, n, prefix):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            tokens[req] = n
            budget -= n

    def _preempt(self, req: Request, step: ScheduledStep) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        step.preempted.append(req)

    def finish(self, req: Request) -> None:
        """Release a request that is done (called after the step that produced its last token)."""
        self.kv.free(req)
        req.status = RequestStatus.FINISHED
