"""A small deterministic model implementing `ServingModel` over a paged KV cache, and its plain greedy loop.

One attention layer in float64: h = embedding[id] + position_table[pos]; K/V of every fed token are written at
its slot (slot -1: skipped); each row's last token attends to positions 0..seq_len-1 read through the block
table; the next token is the argmax of (h + attention) @ embedding^T. The cache starts as NaN, so any read of a
slot no step wrote turns that row's token into garbage the golden comparison catches. `greedy_reference` runs
the same math without a cache, one whole sequence at a time.
"""
from __future__ import annotations

import torch

from pypto_rt.serving.batch import ForwardBatch


class ToyModel:
    def __init__(self, vocab: int = 64, dim: int = 16, block_size: int = 4, max_len: int = 512, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.block_size = block_size
        self.embedding = torch.randn(vocab, dim, generator=g, dtype=torch.float64)
        self.position_table = torch.randn(max_len, dim, generator=g, dtype=torch.float64) * 0.5
        self.wq, self.wk, self.wv, self.wo = (torch.randn(dim, dim, generator=g, dtype=torch.float64) / dim ** 0.5
                                              for _ in range(4))
        self.k_cache = self.v_cache = None
        self.batches: list[dict] = []        # a copy of every batch the model was given
        self.record = True

    def allocate_kv_cache(self, num_blocks: int) -> None:
        shape = (num_blocks, self.block_size, self.embedding.shape[1])
        self.k_cache = torch.full(shape, float("nan"), dtype=torch.float64)
        self.v_cache = torch.full(shape, float("nan"), dtype=torch.float64)

    def _hidden(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids] + self.position_table[positions]

    def _next_token(self, h_last: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> int:
        q = h_last @ self.wq
        att = torch.softmax(keys @ q / keys.shape[1] ** 0.5, dim=0) @ values
        return int(torch.argmax((h_last + att @ self.wo) @ self.embedding.T))

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.record:
            self.batches.append({name: getattr(batch, name).clone() for name in
                                 ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens",
                                  "query_start_loc")} | {"is_decode": batch.is_decode, "batch": batch,
                                                         "max_seq_len": batch.max_seq_len})
        h = self._hidden(batch.input_ids, batch.positions)
        live = batch.slot_mapping >= 0
        slots = batch.slot_mapping[live]
        self.k_cache.view(-1, h.shape[1])[slots] = (h @ self.wk)[live]
        self.v_cache.view(-1, h.shape[1])[slots] = (h @ self.wv)[live]
        out = torch.zeros(batch.num_requests, dtype=torch.int64)
        bs = self.block_size
        for b in range(batch.num_requests):
            n = int(batch.seq_lens[b])
            if n == 0:                          # padding (or idle) row: reads nothing
                continue
            pos = torch.arange(n)
            rows = batch.block_tables[b, pos // bs].long() * bs + pos % bs
            keys = self.k_cache.view(-1, h.shape[1])[rows]
            values = self.v_cache.view(-1, h.shape[1])[rows]
            out[b] = self._next_token(h[int(batch.query_start_loc[b + 1]) - 1], keys, values)
        return out

    def greedy_reference(self, prompt: list[int], max_new_tokens: int, eos_id: int | None = None) -> list[int]:
        """The plain greedy loop: the whole sequence recomputed each token, no cache."""
        tokens = list(prompt)
        out = []
        while len(out) < max_new_tokens:
            ids = torch.tensor(tokens)
            h = self._hidden(ids, torch.arange(len(tokens)))
            token = self._next_token(h[-1], h @ self.wk, h @ self.wv)
            tokens.append(token)
            out.append(token)
            if token == eos_id:
                break
        return out
