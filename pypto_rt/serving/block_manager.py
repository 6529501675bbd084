"""The KV block manager of one rank: which blocks and which batch row each running request holds.

It joins the pool (`block_pool`: reference counts, LRU free queue, prefix cache) to the persistent tables
(`block_table`). Invariants:
- `rows` lists the running requests densely: request `rows[r]` has `row == r` and its block ids in table row r;
  a request that leaves is replaced by the last row (one row moved), so rows stay dense and only the rows
  whose blocks changed are written;
- a request's blocks cover exactly its computed tokens plus the tokens of the step being scheduled
  (ceil(tokens / block_size) blocks, never more: a decode's token lies in its last block, which the table's
  decode path relies on); allocation is all or nothing (a failed `allocate` changes nothing: the scheduler
  then preempts and retries);
- prefix hits are full blocks only, and at least one token of a request is always left to compute (its logits
  give the next token);
- `free` releases a request's blocks last first, so its tail is evicted before the prefix others may share;
- a full, computed block is in the prefix cache by the time its request takes its next block or is freed (vLLM
  records full blocks at allocation): a decode step need not look at rows that crossed no block.
"""
from __future__ import annotations

import numpy as np

from pypto_rt.serving.block_pool import BlockPool, KVBlock
from pypto_rt.serving.block_table import BlockTable
from pypto_rt.serving.request import Request
from pypto_rt.serving.serving_errors import RequestTooLargeError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_batch: int, max_blocks_per_seq: int,
                 max_num_tokens: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.max_batch = max_batch
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.table = BlockTable(max_batch, max_blocks_per_seq, block_size, max_num_tokens)
        self.rows: list[Request] = []
        self.prefix_queried_tokens = 0     # prompt tokens of admitted requests
        self.prefix_hit_tokens = 0         # of which found in the prefix cache

    @property
    def num_blocks(self) -> int:
        return len(self.pool.blocks)

    def check_fits(self, req: Request) -> None:
        """Raise if req can never run: more blocks than a table row or than the whole pool (the last output
        token's K/V is never written, so prompt + max_new_tokens - 1 tokens need slots)."""
        tokens = len(req.prompt_ids) + req.max_new_tokens - 1
        need = cdiv(tokens, self.block_size)
        if need > self.table.max_blocks_per_seq:
            raise RequestTooLargeError(
                f"request {req.request_id}: {len(req.prompt_ids)} prompt + {req.max_new_tokens} new tokens exceed "
                f"max_model_len {self.table.max_blocks_per_seq * self.block_size}",
                hint="shorten the prompt or max_new_tokens, or raise EngineConfig.max_model_len")
        if need > self.num_blocks:
            raise RequestTooLargeError(
                f"request {req.request_id} needs {need} KV blocks of {self.block_size} tokens; the pool has "
                f"{self.num_blocks}", hint="raise EngineConfig.num_blocks or lower max_new_tokens")

    def lookup_prefix(self, req: Request) -> list[KVBlock]:
        """The longest run of req's leading full blocks found in the prefix cache, leaving >= 1 token to compute.
        Only for a request holding no block (a new or preempted one)."""
        if not self.pool.enable_caching or req.blocks:
            return []
        hashes = req.full_block_hashes(self.block_size)[:(req.num_tokens - 1) // self.block_size]
        hits = []
        for block_hash in hashes:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(self, req: Request, num_new_tokens: int, prefix: list[KVBlock] = ()) -> bool:
        """Blocks for req's prefix hits plus num_new_tokens more tokens, and a row if req has none. Returns False,
        changing nothing, when the pool (or the batch) has too little room."""
        bs = self.block_size
        if not prefix and req.row >= 0:       # a running request (a decode, a further chunk)
            need = -(-(req.num_computed_tokens + num_new_tokens) // bs) - len(req.blocks)
            if need <= 0:
                return True                   # its last block has room
            if need > self.pool.num_free:
                return False
            if req.num_computed_tokens // bs > req.num_cached_blocks:
                self.cache_computed(req)      # its last block is full: findable before the step
            self._grow(req, self.pool.get_new_blocks(need))
            return True
        computed = req.num_computed_tokens + len(prefix) * bs
        need = cdiv(computed + num_new_tokens, bs) - len(req.blocks) - len(prefix)
        revived = sum(1 for block in prefix if block.ref_cnt == 0)    # leave the free queue when touched
        if need + revived > self.pool.num_free or (req.row < 0 and len(self.rows) >= self.max_batch):
            return False
        if req.row < 0:
            req.row = len(self.rows)
            self.rows.append(req)
            self.prefix_queried_tokens += req.num_tokens
            self.prefix_hit_tokens += len(prefix) * bs
            req.num_prefix_hit_tokens = len(prefix) * bs
        self.pool.touch(prefix)
        self._grow(req, list(prefix) + (self.pool.get_new_blocks(need) if need > 0 else []))
        req.num_computed_tokens = computed
        req.num_cached_blocks += len(prefix)
        return True

    def grow_rows(self, rows: list[int]) -> bool:
        """One more block for each of these rows: a decode step's rows whose token falls past their last block
        (exactly at its end: blocks are allocated exactly), their full last blocks recorded on the way. Returns
        False, changing nothing, when the pool has too few free blocks (the scheduler then goes row by row and
        preempts, and `allocate` sizes any row that is not exactly at its end)."""
        bs, table, reqs = self.block_size, self.table, self.rows
        if len(rows) > self.pool.num_free:
            return False
        for r in rows:
            if reqs[r].num_computed_tokens != len(reqs[r].blocks) * bs:
                return False
        for r, block in zip(rows, self.pool.get_new_blocks(len(rows))):
            req = reqs[r]
            if req.num_computed_tokens // bs > req.num_cached_blocks:
                self.cache_computed(req)
            req.blocks.append(block)
            table.append(r, (block.block_id,))
        return True

    def _grow(self, req: Request, blocks: list[KVBlock]) -> None:
        """Append blocks to req's block list and table row."""
        if blocks:
            req.blocks.extend(blocks)
            self.table.append(req.row, [block.block_id for block in blocks])

    def decode_positions(self) -> np.ndarray:
        """Each row's next token position (its computed tokens), as the decode path's vector. In steady decode,
        the last decode's positions + 1 (no read per row; the first and last rows are checked against them)."""
        rows = self.rows
        known = self.table.predicted_decode_positions(len(rows))
        if known is not None and known[0] == rows[0].num_computed_tokens and \
                known[-1] == rows[-1].num_computed_tokens:
            return known
        return np.fromiter([req.num_computed_tokens for req in rows], np.int64, len(rows))

    def rows_needing_blocks(self, positions: np.ndarray) -> list[int]:
        """Rows (ascending) whose next token, at positions[r], falls past their last block: in a decode step
        only these need `allocate` (about one row in block_size), found without a call per row. They are also
        the only rows whose last block became full (blocks are allocated exactly), and `allocate` records it."""
        return self.table.rows_needing_blocks(positions)

    def cache_computed(self, req: Request) -> None:
        """Record req's newly full, computed blocks in the prefix cache (after a step wrote their K/V)."""
        full = min(req.num_computed_tokens // self.block_size, len(req.blocks))
        if full > req.num_cached_blocks:
            hashes = req.full_block_hashes(self.block_size)
            for i in range(req.num_cached_blocks, full):
                self.pool.cache_block(req.blocks[i], hashes[i])
            req.num_cached_blocks = full

    def free(self, req: Request) -> None:
        """Release req's blocks (last first) and its row; the last row moves into the hole. Its full, computed
        blocks are recorded first (they stay findable in the free queue until evicted)."""
        self.cache_computed(req)
        self.pool.free_blocks(reversed(req.blocks))
        req.blocks = []
        req.num_cached_blocks = 0
        last = self.rows.pop()
        if last is not req:
            self.rows[req.row] = last
            self.table.move(last.row, req.row)
            last.row = req.row
        else:
            self.table.clear(req.row)
        req.row = -1

    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0
