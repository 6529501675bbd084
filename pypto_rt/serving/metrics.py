"""Serving metrics: throughput, time to first token and time per output token (p50/p99), batch size per step,
per-expert token counts (filled by the model through `record_expert_tokens`), prefix-cache hit rate,
preemptions; a one-line progress display and a final summary.

TTFT = first output token's time - arrival; TPOT = (finish - first token) / (output tokens - 1), per request
with at least 2 output tokens (vLLM's definitions). Times come from the engine's clock.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from pypto_rt.serving.request import Request


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (1..99, inclusive method); the value itself for one sample, nan for none."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class ServingMetrics:
    clock: Callable[[], float] = time.perf_counter
    start_time: float | None = None
    end_time: float | None = None    # the last step's end
    steps: int = 0
    empty_steps: int = 0
    step_seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)     # live rows of each non-empty step
    tokens_per_step: list[int] = field(default_factory=list)
    fed_tokens: int = 0             # tokens fed to the model (prompts, decodes, recomputation after preemption)
    output_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    finished: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefix_queried_tokens: int = 0
    expert_tokens: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> [num_experts] int64

    def on_step(self, live_rows: int, fed_tokens: int, new_tokens: int, seconds: float) -> None:
        if self.start_time is None:
            self.start_time = self.clock() - seconds
        self.end_time = self.clock()
        self.steps += 1
        self.step_seconds += seconds
        if live_rows == 0:
            self.empty_steps += 1
            return
        self.batch_sizes.append(live_rows)
        self.tokens_per_step.append(fed_tokens)
        self.fed_tokens += fed_tokens
        self.output_tokens += new_tokens

    def on_finish(self, req: Request) -> None:
        self.finished += 1
        if req.first_token_time is not None:
            self.ttft.append(req.first_token_time - req.arrival_time)
            n = len(req.output_ids)
            if n > 1 and req.finish_time is not None:
                self.tpot.append((req.finish_time - req.first_token_time) / (n - 1))

    def record_expert_tokens(self, counts: torch.Tensor, layer: int = 0) -> None:
        """Add one MoE call's tokens per expert ([num_experts] or [ranks, local experts]) to `layer`'s totals."""
        counts = counts.detach().reshape(-1).to(torch.int64).cpu()
        total = self.expert_tokens.get(layer)
        self.expert_tokens[layer] = counts.clone() if total is None else total + counts

    def elapsed(self) -> float:
        """Seconds from the first step's start to the last step's end."""
        return self.end_time - self.start_time if self.start_time is not None else 0.0

    def summary_dict(self) -> dict:
        elapsed = self.elapsed()
        out = {
            "requests": self.finished, "steps": self.steps, "empty_steps": self.empty_steps,
            "output_tokens": self.output_tokens, "fed_tokens": self.fed_tokens, "elapsed_s": elapsed,
            "output_tokens_per_s": self.output_tokens / elapsed if elapsed > 0 else 0.0,
            "fed_tokens_per_s": self.fed_tokens / elapsed if elapsed > 0 else 0.0,
            "ttft_p50_s": percentile(self.ttft, 50), "ttft_p99_s": percentile(self.ttft, 99),
            "tpot_p50_s": percentile(self.tpot, 50), "tpot_p99_s": percentile(self.tpot, 99),
            "batch_mean": statistics.fmean(self.batch_sizes) if self.batch_sizes else 0.0,
            "batch_max": max(self.batch_sizes, default=0), "preemptions": self.preemptions,
            "prefix_hit_rate": (self.prefix_hit_tokens / self.prefix_queried_tokens
                                if self.prefix_queried_tokens else 0.0)}
        if self.expert_tokens:
            per_expert = sum(self.expert_tokens.values())
            out["expert_tokens"] = per_expert.tolist()
            mean = per_expert.double().mean().item()
            out["expert_imbalance"] = per_expert.max().item() / mean if mean > 0 else 0.0
        return out

    def progress_line(self, waiting: int, running: int) -> str:
        elapsed = self.elapsed()
        rate = self.output_tokens / elapsed if elapsed > 0 else 0.0
        batch = self.batch_sizes[-1] if self.batch_sizes else 0
        return (f"[serve] step {self.steps:5d}  done {self.finished:4d}  running {running:3d}  waiting {waiting:4d}"
                f"  batch {batch:3d}  out {self.output_tokens:6d} tok  {rate:8.1f} tok/s")

    def summary(self) -> str:
        s = self.summary_dict()
        ms = 1e3
        lines = [
            f"requests {s['requests']}, steps {s['steps']} ({s['empty_steps']} empty), {s['elapsed_s']:.2f} s",
            f"throughput: {s['output_tokens_per_s']:.1f} output tok/s, {s['fed_tokens_per_s']:.1f} fed tok/s "
            f"({s['output_tokens']} tokens out, {s['fed_tokens']} fed to the model)",
            f"TTFT p50 {s['ttft_p50_s'] * ms:.1f} ms, p99 {s['ttft_p99_s'] * ms:.1f} ms; "
            f"TPOT p50 {s['tpot_p50_s'] * ms:.1f} ms, p99 {s['tpot_p99_s'] * ms:.1f} ms",
            f"batch size mean {s['batch_mean']:.1f}, max {s['batch_max']}; preemptions {s['preemptions']}; "
            f"prefix-cache hit rate {s['prefix_hit_rate'] * 100:.1f}%"]
        if "expert_tokens" in s:
            lines.append(f"tokens per expert {s['expert_tokens']} (max / mean {s['expert_imbalance']:.2f})")
        return "\n".join(lines)
