"""The KV block pool of one rank, in the vLLM `BlockPool` lineage: reference-counted blocks, a free queue in
eviction (LRU) order, and prefix caching of full blocks keyed by a chained hash.

Invariants:
- a block is in the free queue iff its ref_cnt is 0; the queue's head is evicted first;
- a block is in `cached` iff its `block_hash` is set; a cached block with ref_cnt 0 stays in the free queue
  (a later request can revive it) until it is popped for new use, which evicts its hash;
- block ids are rank-local (0 .. num_blocks - 1): every rank runs its own pool over its own KV pools, so the
  same id on two ranks names two different pages (spec §3.5 pitfall 10).

Every operation is O(1) per block. Imports only the serving errors.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from pypto_rt.serving.serving_errors import PoolExhaustedError


class BlockHash(NamedTuple):
    """A full block's identity: the chained hash of (parent, tokens) and the tokens themselves. The tokens are
    part of the key, so two blocks whose hash values collide still differ unless their tokens match too (vLLM's
    old BlockHashType); the parent is in `value`, so equal tokens after different prefixes differ."""
    value: int
    tokens: tuple[int, ...]


def hash_block_tokens(parent: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    """The chained hash of one full block (Python's tuple hash: deterministic for ints within a process)."""
    tokens = tuple(tokens)
    value = hash((parent.value if parent is not None else None, tokens))
    return tuple.__new__(BlockHash, (value, tokens))    # BlockHash(value, tokens) without its Python __new__


class KVBlock:
    """One block of `block_size` token slots in every layer's K and V pools."""
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free: KVBlock | None = None   # links of the free queue (None: not in it)
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """A doubly-linked list of free blocks between two sentinels: append and remove are O(1), popleft_n O(n)."""

    def __init__(self, blocks: Iterable[KVBlock]):
        self._head, self._tail = KVBlock(-1), KVBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        block.prev_free.next_free, block.next_free.prev_free = block.next_free, block.prev_free
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def popleft_n(self, n: int) -> list[KVBlock]:
        """The first n blocks, unlinked in one pass (n <= num_free)."""
        out, block = [], self._head.next_free
        for _ in range(n):
            out.append(block)
            nxt = block.next_free
            block.prev_free = block.next_free = None
            block = nxt
        self._head.next_free, block.prev_free = block, self._head
        self.num_free -= n
        return out

    def __iter__(self):
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free


class BlockPool:
    """`num_blocks` blocks with reference counts, the free queue, and the hash -> block map of cached blocks."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[BlockHash, KVBlock] = {}
        self.enable_caching = enable_caching

    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take (free ones, cached or not)."""
        return self.free_queue.num_free

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """n blocks from the head of the free queue (least recently freed first), each with ref_cnt 1; a cached
        one loses its hash (it is evicted). Raises PoolExhaustedError, taking nothing, if fewer are free."""
        if n > self.free_queue.num_free:
            raise PoolExhaustedError(f"asked for {n} KV blocks, {self.free_queue.num_free} are free",
                                     hint="free requests first, or give the pool more blocks")
        out = self.free_queue.popleft_n(n)
        for block in out:
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
        return out

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """One more reference to each block (a prefix hit); a block at ref_cnt 0 leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[KVBlock]) -> None:
        """Drop one reference to each block, in the order given; those reaching 0 join the queue's tail in that
        order, so the caller passes a request's blocks last first (its tail is evicted before its prefix)."""
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Record a full, computed block under its hash. A block already cached keeps its hash; if another
        block already holds this hash (two requests computed the same prefix at once) the first one stays and
        this one stays uncached (it is freed like any block)."""
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def reset(self) -> None:
        """Drop every cached hash (blocks in use keep their contents but are no longer found by lookups)."""
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
