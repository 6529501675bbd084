"""The block manager: prefix hits (full blocks, one token left, shared between requests), dense rows, tables
written only where a request's blocks change, exhaustion, slot mappings."""
from __future__ import annotations

import pytest
import torch

from pypto_rt.serving.block_manager import KVCacheManager
from pypto_rt.serving.request import Request
from pypto_rt.serving.serving_errors import RequestTooLargeError

BS = 4


def manager(num_blocks=16, max_batch=4, max_blocks=8, caching=True):
    return KVCacheManager(num_blocks, BS, max_batch, max_blocks, max_num_tokens=32, enable_prefix_caching=caching)


def admit(kv, req):
    """Admit req with all its pending tokens (prefix hits first), then mark them computed and cache them."""
    prefix = kv.lookup_prefix(req)
    assert kv.allocate(req, req.num_tokens - len(prefix) * BS, prefix)
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed(req)
    return prefix


def row(kv, req):
    return kv.table.block_tables[req.row, :len(req.blocks)].tolist()


def test_shared_prefix_hits_full_blocks_and_shares_them():
    kv = manager()
    a = Request(0, list(range(10)), 4)                      # blocks [0..3] [4..7] and 2 tokens
    admit(kv, a)
    b = Request(1, list(range(8)) + [50, 51, 52], 4)        # same two full blocks, then its own
    hits = admit(kv, b)
    assert [blk.block_id for blk in hits] == row(kv, a)[:2] == row(kv, b)[:2]
    assert all(blk.ref_cnt == 2 for blk in hits)
    assert b.num_prefix_hit_tokens == 8 and kv.prefix_hit_rate() == 8 / 21
    assert row(kv, b)[2] not in row(kv, a)


def test_at_least_one_prompt_token_is_left_to_compute():
    kv = manager()
    admit(kv, Request(0, list(range(8)), 4))                # two full blocks cached
    again = Request(1, list(range(8)), 4)                   # the identical prompt
    hits = kv.lookup_prefix(again)
    assert len(hits) == 1                                    # not 2: the last token's logits are needed
    assert kv.allocate(again, 4, hits) and again.num_computed_tokens == 4


def test_partial_blocks_are_not_cached():
    kv = manager()
    admit(kv, Request(0, list(range(6)), 4))                # one full block, one partial
    assert len(kv.pool.cached) == 1
    assert len(kv.lookup_prefix(Request(1, list(range(7)) + [9], 4))) == 1


def test_caching_off_finds_nothing():
    kv = manager(caching=False)
    admit(kv, Request(0, list(range(9)), 4))
    assert kv.lookup_prefix(Request(1, list(range(9)), 4)) == [] and not kv.pool.cached


def test_freed_prefix_is_evicted_last_and_revived_by_a_hit():
    kv = manager(num_blocks=4)
    a = Request(0, list(range(12)), 1)                      # three full blocks
    admit(kv, a)
    ids = [blk.block_id for blk in a.blocks]
    kv.free(a)
    assert [blk.block_id for blk in kv.pool.free_queue] == [3] + ids[::-1]   # tail of a evicted first
    c = Request(1, [60, 61, 62, 63, 64], 1)                 # needs 2 blocks: block 3 and a's last block
    admit(kv, c)
    assert kv.lookup_prefix(Request(2, list(range(12)) + [7], 1))[0].block_id == ids[0]
    assert len(kv.lookup_prefix(Request(3, list(range(12)) + [7], 1))) == 2     # a's 3rd block was evicted


def test_rows_stay_dense_and_a_leaving_request_moves_only_the_last_row():
    kv = manager(max_batch=3)
    reqs = [Request(i, [10 * i + t for t in range(5)], 4) for i in range(3)]
    for req in reqs:
        admit(kv, req)
    before = kv.table.entries_written
    last_ids = row(kv, reqs[2])
    kv.free(reqs[0])
    assert kv.rows == [reqs[2], reqs[1]] and reqs[2].row == 0 and reqs[0].row == -1
    assert row(kv, reqs[2]) == last_ids
    assert kv.table.entries_written - before == len(last_ids)       # one row moved, nothing else written
    assert kv.table.block_tables[2].tolist() == [0] * 8             # the vacated row holds no stale id


def test_decode_steps_write_a_table_entry_only_when_a_block_is_added():
    kv = manager()
    req = Request(0, [1, 2, 3], 10)
    admit(kv, req)
    written = []
    for _ in range(6):                       # positions 3..8: new blocks at positions 4 and 8
        before = kv.table.entries_written
        assert kv.allocate(req, 1)
        written.append(kv.table.entries_written - before)
        req.token_ids.append(7)
        req.num_computed_tokens += 1
    assert written == [0, 1, 0, 0, 0, 1]


def test_a_block_filled_by_decodes_is_cached_when_its_request_takes_the_next_block():
    kv = manager()
    req = Request(0, [1, 2, 3], 10)
    admit(kv, req)                           # 3 tokens: block 0 not full yet
    assert kv.allocate(req, 1)               # the decode of position 3 fills block 0
    req.token_ids.append(7)
    req.num_computed_tokens += 1
    assert kv.allocate(req, 1)               # position 4 takes block 1: block 0 is recorded on the way
    assert kv.pool.lookup(req.block_hashes[0]) is req.blocks[0] and req.num_cached_blocks == 1


def test_a_freed_request_leaves_its_full_blocks_findable():
    kv = manager()
    req = Request(0, [1, 2, 3], 10)
    admit(kv, req)
    assert kv.allocate(req, 1)
    req.token_ids.append(7)
    req.num_computed_tokens += 1             # block 0 full, not recorded yet (no next block taken)
    first = req.blocks[0]
    kv.free(req)
    again = Request(1, [1, 2, 3, 7, 9], 4)
    assert kv.lookup_prefix(again) == [first]


class CountedRequest(Request):
    """A request that counts reads of its position (the decode path's per-row Python)."""
    reads = 0

    @property
    def num_computed_tokens(self):
        CountedRequest.reads += 1
        return self._computed

    @num_computed_tokens.setter
    def num_computed_tokens(self, value):
        self._computed = value


def decode_step(kv):
    """One decode step as the scheduler and the runner run it; then every row's token is computed. Returns the
    positions and how many positions the manager read from the requests to find them."""
    CountedRequest.reads = 0
    positions = kv.decode_positions()
    reads = CountedRequest.reads
    for r in kv.rows_needing_blocks(positions):
        assert kv.allocate(kv.rows[r], 1)
    kv.table.fill_decode_slots(positions)
    for req in kv.rows:
        req.token_ids.append(7)
        req.num_computed_tokens += 1
    return positions.tolist(), reads


def test_steady_decode_reads_no_position_per_row_and_stays_exact_across_leaves_and_joins():
    kv = KVCacheManager(64, BS, 8, 8, max_num_tokens=32)
    reqs = [CountedRequest(i, [i] * (i + 1), 12) for i in range(6)]
    for req in reqs:
        admit(kv, req)
    for step in range(9):
        if step == 4:
            kv.free(kv.rows[1])              # a leave moves the last row into the hole
        if step == 6:
            admit(kv, CountedRequest(9, [5, 6], 12))
        want = [req._computed for req in kv.rows]
        positions, reads = decode_step(kv)
        assert positions == want
        assert reads == (len(want) if step in (0, 4, 6) else 2), step   # after a decode with the same rows:
                                                                         # the first and last rows checked


def test_growing_decode_rows_is_all_or_nothing():
    kv = manager(num_blocks=3)
    a, b = Request(0, [1, 2, 3, 4], 8), Request(1, [5, 6, 7, 8], 8)
    admit(kv, a)
    admit(kv, b)                             # 2 of 3 blocks taken; both rows' next tokens need a block
    written = kv.table.entries_written
    assert kv.rows_needing_blocks(kv.decode_positions()) == [0, 1]
    assert not kv.grow_rows([0, 1]) and kv.pool.num_free == 1 and kv.table.entries_written == written
    assert kv.grow_rows([1]) and len(b.blocks) == 2 and row(kv, b)[1] == b.blocks[1].block_id
    a.num_computed_tokens = 3                # not at its last block's end: left to `allocate`
    assert not kv.grow_rows([0]) and len(a.blocks) == 1

def test_failed_allocation_changes_nothing():
    kv = manager(num_blocks=3)
    a = Request(0, list(range(8)), 4)
    admit(kv, a)
    b = Request(1, list(range(30, 39)), 4)                  # needs 3 blocks, 1 is free
    state = (kv.pool.num_free, kv.table.entries_written, list(kv.rows))
    assert not kv.allocate(b, 9)
    assert (kv.pool.num_free, kv.table.entries_written, list(kv.rows)) == state and b.row == -1 and not b.blocks


def test_requests_that_can_never_fit_say_so():
    kv = manager(num_blocks=3, max_blocks=8)
    with pytest.raises(RequestTooLargeError, match="needs 4 KV blocks of 4 tokens; the pool has 3"):
        kv.check_fits(Request(7, list(range(10)), 7))
    with pytest.raises(RequestTooLargeError, match="exceed max_model_len 32"):
        kv.check_fits(Request(8, list(range(30)), 4))
    kv.check_fits(Request(9, list(range(10)), 3))            # 12 tokens: 3 blocks


def test_slot_mapping_follows_the_table_and_pads_with_minus_one():
    kv = manager()
    req = Request(0, list(range(6)), 4)
    admit(kv, req)
    b0, b1 = row(kv, req)
    assert kv.table.fill_slots([(req.row, 2, 4)]) == 4
    assert kv.table.slot_mapping[:5].tolist() == [b0 * BS + 2, b0 * BS + 3, b1 * BS, b1 * BS + 1, -1]
    kv.table.fill_slots([(req.row, 5, 1)])                  # a shorter step: the rest goes back to -1
    assert kv.table.slot_mapping.tolist() == [b1 * BS + 1] + [-1] * 31
    assert kv.table.slot_mapping.dtype == torch.int64 and kv.table.block_tables.dtype == torch.int32
