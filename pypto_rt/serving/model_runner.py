"""The model runner: turns a scheduled step into a `ForwardBatch` over persistent buffers and calls the model.

In the shape of pypto-serving's `ModelRunner` (`warmup`, `run_prefill`, `run_decode`). Buffers are allocated
once at their largest size; a step's `ForwardBatch` is a set of views of them, bound once per padded shape
(`bound`), so a kernel called with it sees the same tensors every time it meets that shape and replays instead
of re-recording. Shapes are padded up to a few buckets: decode rows to `decode_buckets` (1, 2, 4, ... as vLLM
pads CUDA-graph batches), prefill rows to the same and prefill tokens to `prefill_buckets`.

Padding (spec §3.5 pitfalls 1, 3, 4): a padded row has seq_len 0 (it reads no block); a padded token has slot
-1 (it writes nothing), id 0 and position 0. In a decode batch padded row r owns padded token r; in a prefill
batch the padded tokens follow the last live request's and belong to no row (query_start_loc stops at the live
token count). Stale values from a longer previous step are overwritten on every step. A live row that feeds no
token this step (the budget went to earlier rows) has seq_len 0 too; the first row always feeds a token, so
qsl[b + 1] - 1 is a token row (>= 0) for every row whenever T > 0.

Compiling warm-up (`warmup(compile_kernels=True)`, as vLLM compiles and captures every decode batch size before
serving): each decode bucket runs `compile_steps()` steps of live dummy rows under the compiled tier's eager mode
(replay.tier, PYPTO_TIER=eager scoped to these calls), enough to pass recording, the replay's trial, the compile
and the compiled call's trial, so serving steps of those shapes run the faster of the replay and the compiled
code from their first call. Dummy row r feeds token r % vocab (the model's `vocab_size`; without one, token 0)
at position 0 into slot r: those slots belong to no request yet and every slot a request reads it has written
first, so nothing reads them. Afterwards the slots are -1 again. Prefill shapes are not compiled (many token
buckets, each a few steps of a request's life).
"""
from __future__ import annotations

import bisect
import collections
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from pypto_rt.replay.policy import current_policy, policy_scope
from pypto_rt.serving.batch import ForwardBatch
from pypto_rt.serving.block_table import BlockTable
from pypto_rt.serving.scheduler import ScheduledStep
from pypto_rt.serving.serving_errors import ServingConfigError


@runtime_checkable
class ServingModel(Protocol):
    """What the runner needs from a model (issue 15's contract). forward returns the greedy next token of each
    request ([B] int64), read at its last token (row qsl[b + 1] - 1); B == T == 0 is a legal call (a rank with
    no live request still steps: MoE's dispatch is collective). The model owns its per-layer KV pools."""
    block_size: int

    def allocate_kv_cache(self, num_blocks: int) -> None: ...

    def forward(self, batch: ForwardBatch) -> torch.Tensor: ...


def powers_of_two(start: int, stop: int) -> list[int]:
    """start, 2*start, ... and stop itself (the largest bucket is always the maximum)."""
    out, b = [], start
    while b < stop:
        out.append(b)
        b *= 2
    return out + [stop]


def compile_steps() -> int:
    """Steps of one shape that take each of its kernel calls through recording, the replay's trial against the
    engine (replays and engine runs alternating), the eager compile at the first kept replay and the compiled
    call's trial (compiled and replayed calls alternating, one warm-up call each), with one step to spare."""
    policy = current_policy()
    return policy.normal_runs + 1 + 2 * (policy.trial_replays + 1) + 2 * (policy.tier_trial_calls + 1) + 1


def _check_buckets(name: str, buckets: Sequence[int], largest: int) -> list[int]:
    buckets = sorted(set(int(b) for b in buckets))
    if not buckets or buckets[0] < 1 or buckets[-1] < largest:
        raise ServingConfigError(f"{name} {buckets} must be positive and reach {largest}",
                                 hint=f"end {name} with {largest} (or leave it unset for powers of two)")
    return buckets


class ModelRunner:
    def __init__(self, model: ServingModel, table: BlockTable, *, max_batch: int, max_num_tokens: int,
                 decode_buckets: Sequence[int] | None = None, prefill_buckets: Sequence[int] | None = None):
        self.model = model
        self.table = table
        self.decode_buckets = _check_buckets("decode_buckets", decode_buckets or powers_of_two(1, max_batch),
                                             max_batch)
        self.prefill_buckets = _check_buckets(
            "prefill_buckets", prefill_buckets or powers_of_two(min(16, max_num_tokens), max_num_tokens),
            max_num_tokens)
        b_cap = self.decode_buckets[-1]
        t_cap = max(self.prefill_buckets[-1], b_cap)            # a decode batch has T == B tokens
        if t_cap > table.slot_mapping.shape[0] or b_cap > table.block_tables.shape[0]:
            raise ServingConfigError(f"buckets reach {b_cap} rows / {t_cap} tokens; the block table holds "
                                     f"{table.block_tables.shape[0]} rows / {table.slot_mapping.shape[0]} tokens")
        self.input_ids = torch.zeros(t_cap, dtype=torch.int64)
        self.positions = torch.zeros(t_cap, dtype=torch.int64)
        self.seq_lens = torch.zeros(b_cap, dtype=torch.int32)
        self.query_start_loc = torch.zeros(b_cap + 1, dtype=torch.int32)
        self._ids, self._pos = self.input_ids.numpy(), self.positions.numpy()
        self._lens, self._qsl = self.seq_lens.numpy(), self.query_start_loc.numpy()
        self._row_ids = np.arange(b_cap + 1, dtype=np.int32)
        self.bound: dict[tuple[int, int, bool], ForwardBatch] = {}
        self.shapes_run: collections.Counter[tuple[int, int, bool]] = collections.Counter()

    def batch_view(self, rows: int, tokens: int, is_decode: bool) -> ForwardBatch:
        """The pre-bound ForwardBatch of one padded shape (the same tensors every time)."""
        key = (rows, tokens, is_decode)
        batch = self.bound.get(key)
        if batch is None:
            batch = self.bound[key] = ForwardBatch(
                self.input_ids[:tokens], self.positions[:tokens], self.table.slot_mapping[:tokens],
                self.table.block_tables[:rows], self.seq_lens[:rows], self.query_start_loc[:rows + 1], is_decode)
        return batch

    def padded_shape(self, rows: int, tokens: int, is_decode: bool) -> tuple[int, int]:
        if rows == 0:
            return 0, 0
        b = self.decode_buckets[bisect.bisect_left(self.decode_buckets, rows)]
        return (b, b) if is_decode else (b, self.prefill_buckets[bisect.bisect_left(self.prefill_buckets, tokens)])

    def prepare(self, step: ScheduledStep, is_decode: bool) -> ForwardBatch:
        """Write the step's tokens, positions, slots, seq_lens and offsets into the buffers; pad; bind (the bound
        batch's max_seq_len is this step's)."""
        live_rows = len(step.rows)
        t = self._write_decode(step) if is_decode else self._write_prefill(step)
        rows, tokens = self.padded_shape(live_rows, t, is_decode)
        self._lens[live_rows:rows] = 0
        self._ids[t:tokens] = 0
        self._pos[t:tokens] = 0
        if is_decode:
            self._qsl[live_rows:rows + 1] = np.arange(live_rows, rows + 1)
        else:
            self._qsl[live_rows:rows + 1] = t
        batch = self.batch_view(rows, tokens, is_decode)
        batch.max_seq_len = int(self._lens[:rows].max()) if rows else 0    # from the host's copy: no tensor read
        return batch

    def _write_decode(self, step: ScheduledStep) -> int:
        """Row r feeds one token, at position num_computed_tokens (vectorised: the hot path)."""
        b = len(step.rows)
        self._ids[:b] = [req.token_ids[req.num_computed_tokens] for req, _ in step.rows]
        positions = self._pos[:b]
        positions[:] = [req.num_computed_tokens for req, _ in step.rows]
        self._lens[:b] = positions + 1
        self._qsl[:b] = self._row_ids[:b]
        return self.table.fill_decode_slots(positions)

    def _write_prefill(self, step: ScheduledStep) -> int:
        ids, pos, lens, qsl = self._ids, self._pos, self._lens, self._qsl
        spans, t = [], 0
        for r, (req, n) in enumerate(step.rows):
            c = req.num_computed_tokens
            qsl[r] = t
            if n:
                ids[t:t + n] = req.token_ids[c:c + n]
                pos[t:t + n] = np.arange(c, c + n)
            lens[r] = c + n if n else 0
            spans.append((r, c, n))
            t += n
        return self.table.fill_slots(spans)

    def _run(self, step: ScheduledStep, is_decode: bool) -> torch.Tensor:
        batch = self.prepare(step, is_decode)
        self.shapes_run[(batch.num_requests, batch.num_tokens, is_decode)] += 1
        out = self.model.forward(batch)
        return out[:len(step.rows)]

    def run_prefill(self, step: ScheduledStep) -> torch.Tensor:
        """A step with prefill chunks (or idle rows): packed tokens padded to a token bucket."""
        return self._run(step, False)

    def run_decode(self, step: ScheduledStep) -> torch.Tensor:
        """A step in which every row feeds one token: T == B, padded to a decode bucket."""
        if not step.is_decode:
            raise ServingConfigError("run_decode needs a step in which every row feeds exactly one token")
        return self._run(step, True)

    def execute(self, step: ScheduledStep) -> torch.Tensor:
        """Run any step: decode-shaped ones as decode, the others (the empty step too) as prefill."""
        return self.run_decode(step) if step.is_decode else self.run_prefill(step)

    def warmup(self, compile_kernels: bool = False, pool_slots: int | None = None) -> None:
        """One all-padding decode step and one all-padding prefill step at the smallest buckets: they write no
        cache slot and read no block, and bind and record what the first real steps would. With
        `compile_kernels`, then every decode bucket's kernels are compiled (module text; buckets of more rows
        than `pool_slots`, the KV pool's slots, are left out). Call it before any request holds a block."""
        empty = ScheduledStep()
        for is_decode in (True, False):
            rows = self.decode_buckets[0]
            tokens = rows if is_decode else self.prefill_buckets[0]
            self.prepare(empty, is_decode)     # every slot -1
            self._ids[:tokens] = 0
            self._pos[:tokens] = 0
            self._lens[:rows] = 0
            self._qsl[:rows + 1] = np.arange(rows + 1) if is_decode else 0
            batch = self.batch_view(rows, tokens, is_decode)
            batch.max_seq_len = 0
            self.model.forward(batch)
        if compile_kernels:
            self._compile_decode_buckets(pool_slots)

    def _context_bounds(self) -> list[int]:
        """max_seq_len values a decode step can carry, a power of two from the block size up to the table's span
        apart: each picks one size of the paged decode's KV tile (kernels.attention.decode_tile), so the compiling
        warm-up compiles every size; the dummy rows' length 1 is within each."""
        span = self.table.block_tables.shape[1] * self.table.block_size
        return powers_of_two(min(self.table.block_size, span), span)

    def _compile_decode_buckets(self, pool_slots: int | None) -> None:
        vocab = max(1, int(getattr(self.model, "vocab_size", 1)))
        slots = self.table.slot_mapping.numpy()
        with policy_scope(tier="eager"):
            steps = compile_steps()
            for rows in self.decode_buckets:
                if pool_slots is not None and rows > pool_slots:
                    break
                self._ids[:rows] = np.arange(rows) % vocab
                self._pos[:rows] = 0
                self._lens[:rows] = 1
                self._qsl[:rows + 1] = self._row_ids[:rows + 1]
                slots[:rows] = np.arange(rows)
                batch = self.batch_view(rows, rows, True)
                try:
                    for bound in self._context_bounds():   # (the decode attention's KV tile follows max_seq_len)
                        batch.max_seq_len = bound
                        for _ in range(steps):
                            self.model.forward(batch)
                finally:
                    slots[:rows] = -1
        self._ids[:] = 0
        self._lens[:] = 0
