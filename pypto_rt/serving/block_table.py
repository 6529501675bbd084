"""Persistent block tables and slot mappings: the tensors a step's `ForwardBatch` views, written in place.

`block_tables` [max_batch, max_blocks] int32: row r holds the physical ids of batch row r's logical blocks.
Entries are written only where a row's blocks changed (appended blocks, a row moved into a hole); entries past
a row's length and rows past the live ones hold 0, which no reader follows because their seq_len is 0 or
shorter (pypto-serving pads tables with 0 too). `slot_mapping` [max_num_tokens] int64: slot of each of a step's
tokens, -1 for every token past the live ones (the cache write skips them; spec §3.5 pitfalls 1 and 4).

Host writes go through numpy views of the same memory (a numpy item write costs ~0.1 µs, a torch one ~2 µs).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


class BlockTable:
    def __init__(self, max_batch: int, max_blocks_per_seq: int, block_size: int, max_num_tokens: int):
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32)
        self.slot_mapping = torch.full((max_num_tokens,), -1, dtype=torch.int64)
        self._table = self.block_tables.numpy()
        self._slots = self.slot_mapping.numpy()
        self._lengths = [0] * max_batch      # entries written in each row
        # the decode path's vectors: token slots each row holds, and its last block's first slot
        self._capacity = np.zeros(max_batch, dtype=np.int64)
        self._last_base = np.zeros(max_batch, dtype=np.int64)
        self._offset = np.zeros(max_batch, dtype=np.int64)                # scratch: position % block_size
        # the next decode step's positions (the last decode's + 1) while no row moved or prefilled since
        self._next_positions = np.zeros(max_batch, dtype=np.int64)
        self._predicted_rows = 0
        self._live_tokens = 0                # slots written by the last fill (the rest are already -1)
        self.entries_written = 0             # table entries written so far (tests: only changes are written)

    def row_length(self, row: int) -> int:
        return self._lengths[row]

    def append(self, row: int, block_ids: Sequence[int]) -> None:
        """Write block_ids after row's current entries."""
        start = self._lengths[row]
        end = start + len(block_ids)
        if len(block_ids) == 1:
            self._table[row, start] = block_ids[0]
        else:
            self._table[row, start:end] = block_ids
        self._lengths[row] = end
        self._capacity[row] = end * self.block_size
        self._last_base[row] = int(block_ids[-1]) * self.block_size
        self.entries_written += len(block_ids)

    def move(self, src: int, dst: int) -> None:
        """Row src's entries into row dst (a request moved into a hole left by one that finished); src clears."""
        n = self._lengths[src]
        self._table[dst, :n] = self._table[src, :n]
        self._table[dst, n:self._lengths[dst]] = 0
        self._lengths[dst] = n
        self._capacity[dst], self._last_base[dst] = self._capacity[src], self._last_base[src]
        self.entries_written += n
        self.clear(src)
        self._predicted_rows = 0

    def clear(self, row: int) -> None:
        """Zero a row that no request holds any more (stale ids must not outlive their owner)."""
        self._table[row, :self._lengths[row]] = 0
        self._lengths[row] = 0
        self._capacity[row] = self._last_base[row] = 0
        self._predicted_rows = 0

    def rows_needing_blocks(self, positions: np.ndarray) -> list[int]:
        """Rows (ascending) whose next token, at positions[r], falls past their last block."""
        return (positions >= self._capacity[:len(positions)]).nonzero()[0].tolist()   # (flatnonzero: 6 frames)

    def fill_decode_slots(self, positions: np.ndarray) -> int:
        """A decode step's slots: row r feeds one token at positions[r] (int64), rows 0..B-1 in order. The token
        lies in the row's last block: blocks are allocated exactly (ceil(tokens / block_size) for the tokens
        computed and scheduled), so position p of a decode has p // block_size == its last block's index."""
        n = len(positions)
        offset = self._offset[:n]
        np.remainder(positions, self.block_size, out=offset)
        np.add(self._last_base[:n], offset, out=self._slots[:n])
        if n < self._live_tokens:
            self._slots[n:self._live_tokens] = -1
        self._live_tokens = n
        np.add(positions, 1, out=self._next_positions[:n])
        self._predicted_rows = n
        return n

    def predicted_decode_positions(self, n: int) -> np.ndarray | None:
        """Rows 0..n-1's positions if the step after the last `fill_decode_slots` computed one token per row and no
        row moved, left or prefilled since (the caller checks the requests agree); None otherwise."""
        return self._next_positions[:n].copy() if n and self._predicted_rows == n else None

    def fill_slots(self, spans: Sequence[tuple[int, int, int]]) -> int:
        """Write the slots of a step's tokens, packed in order: (row, first position, count) per request. Tokens
        past them, up to the previous step's count, are reset to -1. Returns the number of tokens."""
        bs, table, slots = self.block_size, self._table, self._slots
        t = 0
        for row, start, n in spans:
            if n == 1:
                slots[t] = int(table[row, start // bs]) * bs + start % bs
            elif n:
                pos = np.arange(start, start + n)
                slots[t:t + n] = table[row, pos // bs].astype(np.int64) * bs + pos % bs
            t += n
        if t < self._live_tokens:
            slots[t:self._live_tokens] = -1
        self._live_tokens = t
        self._predicted_rows = 0
        return t
