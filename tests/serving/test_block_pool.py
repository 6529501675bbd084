"""The block pool: reference counts, the free queue in LRU order, prefix-cache entries and their eviction."""
from __future__ import annotations

import pytest

from pypto_rt.serving.block_pool import BlockPool, hash_block_tokens
from pypto_rt.serving.serving_errors import PoolExhaustedError


def ids(blocks):
    return [b.block_id for b in blocks]


def test_new_blocks_come_from_the_head_and_freed_ones_join_the_tail():
    pool = BlockPool(6)
    a = pool.get_new_blocks(3)
    assert ids(a) == [0, 1, 2] and all(b.ref_cnt == 1 for b in a)
    assert ids(pool.free_queue) == [3, 4, 5] and pool.num_free == 3
    pool.free_blocks(reversed(a))             # a request frees its blocks last first
    assert ids(pool.free_queue) == [3, 4, 5, 2, 1, 0]
    assert ids(pool.get_new_blocks(4)) == [3, 4, 5, 2]      # least recently freed first



def test_taking_every_free_block_leaves_a_queue_that_still_links():
    pool = BlockPool(4)
    taken = pool.get_new_blocks(4)
    assert ids(taken) == [0, 1, 2, 3] and list(pool.free_queue) == [] and pool.num_free == 0
    assert all(b.prev_free is None and b.next_free is None for b in taken)
    pool.free_blocks([taken[2], taken[0]])
    assert ids(pool.free_queue) == [2, 0] and ids(pool.get_new_blocks(1)) == [2] and ids(pool.free_queue) == [0]

def test_reference_counts_keep_shared_blocks_out_of_the_free_queue():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    pool.touch(a[:1])                         # a second request shares the first block
    assert a[0].ref_cnt == 2
    pool.free_blocks(reversed(a))
    assert ids(pool.free_queue) == [2, 3, 1] and a[0].ref_cnt == 1
    pool.free_blocks(a[:1])
    assert ids(pool.free_queue) == [2, 3, 1, 0]


def test_touching_a_free_cached_block_revives_it_and_popping_it_evicts_its_hash():
    pool = BlockPool(3)
    (block,) = pool.get_new_blocks(1)
    h = hash_block_tokens(None, [1, 2])
    pool.cache_block(block, h)
    pool.free_blocks([block])
    assert pool.lookup(h) is block and pool.num_free == 3
    pool.touch([block])                       # a prefix hit on a free block takes it out of the queue
    assert block.ref_cnt == 1 and pool.num_free == 2 and 0 not in ids(pool.free_queue)
    pool.free_blocks([block])
    pool.get_new_blocks(3)                    # block 0 is reused: its cache entry goes
    assert pool.lookup(h) is None and block.block_hash is None


def test_chained_hash_depends_on_the_parent():
    first = hash_block_tokens(None, [1, 2])
    assert hash_block_tokens(first, [3, 4]) == hash_block_tokens(hash_block_tokens(None, [1, 2]), [3, 4])
    assert hash_block_tokens(first, [3, 4]) != hash_block_tokens(hash_block_tokens(None, [9, 2]), [3, 4])


def test_a_hash_already_cached_by_another_block_is_not_taken_over():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [5])
    pool.cache_block(a, h)
    pool.cache_block(b, h)                    # the same prefix computed twice at once
    assert pool.lookup(h) is a and b.block_hash is None
    pool.free_blocks([b, a])
    pool.get_new_blocks(1)                    # b is evicted first: a's entry must survive
    assert pool.lookup(h) is a


def test_exhaustion_raises_and_takes_nothing():
    pool = BlockPool(2)
    pool.get_new_blocks(1)
    with pytest.raises(PoolExhaustedError, match="asked for 2 KV blocks, 1 are free"):
        pool.get_new_blocks(2)
    assert pool.num_free == 1


def test_reset_forgets_every_cached_hash():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [1])
    pool.cache_block(a, h)
    pool.reset()
    assert pool.lookup(h) is None and a.block_hash is None and a.ref_cnt == 1
