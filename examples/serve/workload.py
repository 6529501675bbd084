"""The flagship's request stream: a seeded list of requests with different prompt and output lengths, some
sharing a prefix, arriving over the run (at a step, not all at step 0), assigned to ranks round-robin.

Arrival is counted in engine steps, not seconds: every rank steps in lockstep (MoE's dispatch is collective),
so a step number means the same moment on every rank and the stream is the same on every run of a seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadRequest:
    request_id: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_step: int


@dataclass(frozen=True)
class WorkloadShape:
    num_requests: int = 32
    prompt_len: tuple[int, int] = (8, 48)        # inclusive range of a prompt's own tokens
    output_len: tuple[int, int] = (8, 32)        # inclusive range of max_new_tokens
    shared_prefixes: int = 2                     # distinct system prompts
    prefix_len: int = 32                         # tokens of each shared prefix
    shared_fraction: float = 0.4                 # requests that start with a shared prefix
    mean_gap_steps: float = 1.5                  # mean steps between arrivals (exponential gaps)


def make_workload(shape: WorkloadShape, vocab_size: int, seed: int) -> list[WorkloadRequest]:
    """`shape.num_requests` requests in arrival order, the same on every rank for one seed."""
    rng = random.Random(seed)
    token = lambda: rng.randrange(1, vocab_size)     # noqa: E731  (0 is the runner's padding id)
    prefixes = [tuple(token() for _ in range(shape.prefix_len)) for _ in range(shape.shared_prefixes)]
    requests, step = [], 0.0
    for rid in range(shape.num_requests):
        own = tuple(token() for _ in range(rng.randint(*shape.prompt_len)))
        shared = prefixes and rng.random() < shape.shared_fraction
        prompt = rng.choice(prefixes) + own if shared else own
        requests.append(WorkloadRequest(rid, prompt, rng.randint(*shape.output_len), int(step)))
        step += rng.expovariate(1.0 / shape.mean_gap_steps) if shape.mean_gap_steps > 0 else 0.0
    return requests


def assign_rank(request: WorkloadRequest, world_size: int) -> int:
    """Attention data-parallel: request i is served by rank i mod world_size (each rank its own KV pool)."""
    return request.request_id % world_size


def longest_request(requests: list[WorkloadRequest]) -> int:
    """Prompt plus output tokens of the longest request (the engine's max_model_len)."""
    return max(len(r.prompt) + r.max_new_tokens for r in requests)
