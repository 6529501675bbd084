"""The flagship's end-of-run report: what each rank measured (`RankReport`, gathered to rank 0) and rank 0's
summary over all ranks: throughput, TTFT / TPOT p50 and p99, batch size per step, prefix-cache hit rate,
tokens per expert, and the golden check's verdict."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

import torch

from examples.serve.golden_check import RequestVerdict
from pypto_rt.serving import ServingMetrics
from pypto_rt.serving.metrics import percentile


@dataclass
class RankReport:
    rank: int
    seconds: float                  # the serving loop, first step to last
    model_seconds: float            # of which in the model's forward (kernels, MoE communication)
    agree_seconds: float            # of which in the all-reduce before each step
    moe_seconds: float              # of model_seconds, in the MoE layers (dispatch/combine and their waits too)
    steps: int
    empty_steps: int
    output_tokens: int
    fed_tokens: int
    ttft: list[float]
    tpot: list[float]
    batch_sizes: list[int]          # live rows of each non-empty step
    prefix_hit_tokens: int
    prefix_queried_tokens: int
    preemptions: int
    expert_tokens: list[list[int]]  # [layer][local expert]: rows each of this rank's experts received
    verdicts: list[RequestVerdict]

    @classmethod
    def of(cls, rank: int, m: ServingMetrics, seconds: float, agree_seconds: float, moe_seconds: float,
           verdicts: list[RequestVerdict]) -> "RankReport":
        experts = [m.expert_tokens[layer].tolist() for layer in sorted(m.expert_tokens)]
        return cls(rank, seconds, m.step_seconds, agree_seconds, moe_seconds, m.steps, m.empty_steps, m.output_tokens, m.fed_tokens,
                   list(m.ttft), list(m.tpot), list(m.batch_sizes), m.prefix_hit_tokens, m.prefix_queried_tokens,
                   m.preemptions, experts, verdicts)


def expert_totals(reports: list[RankReport]) -> list[int]:
    """Rows per global expert over all layers: rank r holds experts r * E_local .. (r + 1) * E_local - 1."""
    per_rank = [torch.tensor(r.expert_tokens, dtype=torch.int64).sum(0) if r.expert_tokens else torch.zeros(0)
                for r in reports]
    return torch.cat(per_rank).to(torch.int64).tolist()


def summary(reports: list[RankReport]) -> dict:
    """The run's figures over all ranks (times in seconds)."""
    seconds = max(r.seconds for r in reports)
    out_tokens, fed = sum(r.output_tokens for r in reports), sum(r.fed_tokens for r in reports)
    ttft = [t for r in reports for t in r.ttft]
    tpot = [t for r in reports for t in r.tpot]
    batches = [b for r in reports for b in r.batch_sizes]
    hit, queried = sum(r.prefix_hit_tokens for r in reports), sum(r.prefix_queried_tokens for r in reports)
    share = lambda part: statistics.fmean(part(r) / r.seconds for r in reports if r.seconds > 0)  # noqa: E731
    return {"ranks": len(reports), "seconds": seconds, "steps": reports[0].steps, "output_tokens": out_tokens,
            "fed_tokens": fed, "output_tokens_per_s": out_tokens / seconds, "fed_tokens_per_s": fed / seconds,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "batch_mean": statistics.fmean(batches) if batches else 0.0, "batch_max": max(batches, default=0),
            "empty_steps": [r.empty_steps for r in reports], "preemptions": sum(r.preemptions for r in reports),
            "prefix_hit_tokens": hit, "prefix_queried_tokens": queried,
            "prefix_hit_rate": hit / queried if queried else 0.0, "expert_tokens": expert_totals(reports),
            "model_share": share(lambda r: r.model_seconds), "agree_share": share(lambda r: r.agree_seconds),
            "moe_share": share(lambda r: r.moe_seconds)}


def summary_lines(s: dict) -> list[str]:
    ms = 1e3
    host = 1 - s["model_share"] - s["agree_share"]
    return [
        f"throughput   {s['output_tokens_per_s']:.1f} output tok/s ({s['output_tokens']} tokens in "
        f"{s['seconds']:.1f} s; {s['fed_tokens_per_s']:.1f} tok/s fed to the model, prompts included)",
        f"TTFT         p50 {s['ttft_p50_s'] * ms:.0f} ms   p99 {s['ttft_p99_s'] * ms:.0f} ms",
        f"TPOT         p50 {s['tpot_p50_s'] * ms:.0f} ms   p99 {s['tpot_p99_s'] * ms:.0f} ms",
        f"batch/step   mean {s['batch_mean']:.1f}  max {s['batch_max']} rows per rank; steps {s['steps']}, of which "
        f"empty per rank {s['empty_steps']}; preemptions {s['preemptions']}",
        f"prefix cache {100 * s['prefix_hit_rate']:.1f}% of prompt tokens hit "
        f"({s['prefix_hit_tokens']}/{s['prefix_queried_tokens']})",
        f"experts      rows per expert (all layers, live tokens only): {s['expert_tokens']}",
        f"time         model forward {100 * s['model_share']:.0f}% (MoE layers {100 * s['moe_share']:.0f}%: router, "
        f"dispatch, experts, combine; attention and dense layers the rest), step all-reduce "
        f"{100 * s['agree_share']:.0f}% (with the wait for the slowest rank), host {100 * host:.0f}% (scheduling, "
        "bookkeeping, the golden check excluded)"]


def print_report(reports: list[RankReport], tolerance: float, json_path: str | None = None) -> bool:
    """Rank 0: the summary and the golden check (also to `json_path`); True when every request passed."""
    verdicts = sorted((v for r in reports for v in r.verdicts), key=lambda v: v.request_id)
    failed = [v for v in verdicts if not v.ok]
    figures = summary(reports)
    print("\n".join(summary_lines(figures)), flush=True)
    rule = "tokens equal to the golden's" if tolerance == 0 else \
        f"each token within 2 x {tolerance} of the golden's top logit"
    for v in failed:
        print(f"  request {v.request_id}: {v.detail}", flush=True)
    word = "PASS" if not failed else "FAIL"
    print(f"golden check {word}: {len(verdicts) - len(failed)}/{len(verdicts)} requests with {rule} "
          f"(GoldenDecoder, one process)", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(figures, passed=not failed, failed_requests=[v.request_id for v in failed]), f, indent=1)
    return not failed
