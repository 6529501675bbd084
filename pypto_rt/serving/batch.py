"""`ForwardBatch`: one model step's input, in the vLLM / pypto-serving layout (packed token-major, no padding to a
maximum length). The runner builds it from persistent tensors; the model reads it and writes the KV cache.

Rows past the live requests are padding: their slot_mapping entries are -1 (the cache write skips them) and their
seq_lens are 0 (attention reads no block for them and writes zeros, never NaN).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor        # [T] int64: the step's tokens, request after request (decode: T == B)
    positions: torch.Tensor        # [T] int64: each token's position in its sequence
    slot_mapping: torch.Tensor     # [T] int64: cache slot = block_id * block_size + position % block_size; -1 = skip
    block_tables: torch.Tensor     # [B, max_blocks] int32: physical block ids of each request's logical blocks
    seq_lens: torch.Tensor         # [B] int32: context length after this step's tokens (0: padding row)
    query_start_loc: torch.Tensor  # [B + 1] int32: request b's tokens are input_ids[qsl[b]:qsl[b + 1]]
    is_decode: bool                # every request has exactly one new token (T == B)
    max_seq_len: int | None = None  # the longest seq_lens entry, as the host knows it (the runner rewrites it
                                    # every step; None: not given, a reader takes it from seq_lens)

    @property
    def num_requests(self) -> int:
        return self.block_tables.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
