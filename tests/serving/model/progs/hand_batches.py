"""Stepping a serving model by hand, as a runner would but with every choice written down: each request owns a
fixed run of KV blocks, and a schedule says, per step, which requests run and how many prompt tokens each feeds
(None: one decode token). Builds the `ForwardBatch` of each step and collects each request's greedy tokens."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pypto_rt.serving.batch import ForwardBatch

PAD = "pad"      # a schedule entry for a padding row: token 0, slot -1, seq_len 0


@dataclass
class Request:
    prompt: list[int]
    blocks: list[int]
    fed: int = 0                                  # prompt tokens already in the cache
    out: list[int] = field(default_factory=list)  # generated tokens

    @property
    def context(self) -> int:
        return self.fed + max(len(self.out) - 1, 0)


class HandBatches:
    def __init__(self, prompts: list[list[int]], block_size: int, blocks_per_request: int, first_block: int = 0):
        self.block_size = block_size
        self.requests = [Request(list(p), list(range(first_block + i * blocks_per_request,
                                                     first_block + (i + 1) * blocks_per_request)))
                         for i, p in enumerate(prompts)]
        self.width = blocks_per_request

    def batch(self, entries: list) -> ForwardBatch:
        """entries: (request index, prompt tokens to feed) or (request index, None) for a decode token, or PAD."""
        ids, positions, slots, tables, lens, qsl = [], [], [], [], [], [0]
        for entry in entries:
            if entry == PAD:
                ids.append(0), positions.append(0), slots.append(-1), lens.append(0)
                tables.append([0] * self.width)
                qsl.append(len(ids))
                continue
            req = self.requests[entry[0]]
            if entry[1] is None:
                start, tokens = req.context, [req.out[-1]]
            else:
                start, tokens = req.fed, req.prompt[req.fed:req.fed + entry[1]]
            for i, token in enumerate(tokens):
                pos = start + i
                ids.append(token), positions.append(pos)
                slots.append(req.blocks[pos // self.block_size] * self.block_size + pos % self.block_size)
            tables.append(req.blocks)
            lens.append(start + len(tokens))
            qsl.append(len(ids))
        decode = all(e == PAD or e[1] is None for e in entries)
        return ForwardBatch(torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
                            torch.tensor(slots, dtype=torch.int64),
                            torch.tensor(tables, dtype=torch.int32).view(len(tables), self.width),
                            torch.tensor(lens, dtype=torch.int32), torch.tensor(qsl, dtype=torch.int32), decode)

    def step(self, model, entries: list) -> torch.Tensor:
        """Run one step; a request whose prompt is complete after it (or that decoded) takes its new token."""
        tokens = model.forward(self.batch(entries))
        assert tokens.shape == (len(entries),) and tokens.dtype == torch.int64
        for entry, token in zip(entries, tokens.tolist()):
            if entry == PAD:
                continue
            req = self.requests[entry[0]]
            if entry[1] is not None:
                req.fed += entry[1]
            if req.fed == len(req.prompt):
                req.out.append(token)
        return tokens

    def outputs(self) -> list[list[int]]:
        return [req.out for req in self.requests]
