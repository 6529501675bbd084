"""The flagship's end-of-run report: what each rank measured (`RankReport`, gathered to rank 0) and rank 0's
summary over all ranks: throughput, TTFT / TPOT p50 and p99, batch size per step, prefix-cache hit rate,
tokens per expert, and the golden check's verdict."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from examples.serve.golden_check import RequestVerdict
from pypto_rt.serving import ServingMetrics
from pypto_rt.serving.metrics import percentile
from pypto_rt.serving.model import DecoderConfig


@dataclass
class RankReport:
    rank: int
    seconds: float                  # the serving loop, first step to last
    model_seconds: float            # of which in the model's forward (kernels, MoE communication)
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
    def of(cls, rank: int, m: ServingMetrics, seconds: float, verdicts: list[RequestVerdict]) -> "RankReport":
        experts = [m.expert_tokens[layer].tolist() for layer in sorted(m.expert_tokens)]
        return cls(rank, seconds, m.step_seconds, m.steps, m.empty_steps, m.output_tokens, m.fed_tokens,
                   list(m.ttft), list(m.tpot), list(m.batch_sizes), m.prefix_hit_tokens, m.prefix_queried_tokens,
                   m.preemptions, experts, verdicts)


def expert_totals(reports: list[RankReport]) -> list[int]:
    """Rows per global expert over all layers: rank r holds experts r * E_local .. (r + 1) * E_local - 1."""
    per_rank = [torch.tensor(r.expert_tokens, dtype=torch.int64).sum(0) if r.expert_tokens else torch.zeros(0)
                for r in reports]
    return torch.cat(per_rank).to(torch.int64).tolist()


def summary_lines(reports: list[RankReport]) -> list[str]:
    seconds = max(r.seconds for r in reports)
    out_tokens, fed = sum(r.output_tokens for r in reports), sum(r.fed_tokens for r in reports)
    ttft = [t for r in reports for t in r.ttft]
    tpot = [t for r in reports for t in r.tpot]
    batches = [b for r in reports for b in r.batch_sizes]
    hit, queried = sum(r.prefix_hit_tokens for r in reports), sum(r.prefix_queried_tokens for r in reports)
    model = statistics.fmean(r.model_seconds / r.seconds for r in reports if r.seconds > 0)
    ms = 1e3
    return [
        f"throughput   {out_tokens / seconds:.1f} output tok/s ({out_tokens} tokens in {seconds:.1f} s; "
        f"{fed / seconds:.1f} tok/s fed to the model, prompts included)",
        f"TTFT         p50 {percentile(ttft, 50) * ms:.0f} ms   p99 {percentile(ttft, 99) * ms:.0f} ms",
        f"TPOT         p50 {percentile(tpot, 50) * ms:.0f} ms   p99 {percentile(tpot, 99) * ms:.0f} ms",
        f"batch/step   mean {statistics.fmean(batches) if batches else 0:.1f}  max {max(batches, default=0)} rows "
        f"per rank; steps {reports[0].steps}, of which empty per rank "
        f"{[r.empty_steps for r in reports]}; preemptions {sum(r.preemptions for r in reports)}",
        f"prefix cache {100 * hit / queried if queried else 0:.1f}% of prompt tokens hit ({hit}/{queried})",
        f"experts      rows per expert (all layers, padded rows included): {expert_totals(reports)}",
        f"time         {100 * model:.0f}% of the loop in the model's forward (kernels and MoE communication), the "
        f"rest host: scheduling, the step all-reduce"]


def print_report(reports: list[RankReport], cfg: DecoderConfig, tolerance: float) -> bool:
    """Rank 0: the summary and the golden check; True when every request passed."""
    verdicts = sorted((v for r in reports for v in r.verdicts), key=lambda v: v.request_id)
    failed = [v for v in verdicts if not v.ok]
    print("\n".join(summary_lines(reports)), flush=True)
    rule = "tokens equal to the golden's" if tolerance == 0 else \
        f"each token within 2 x {tolerance} of the golden's top logit"
    for v in failed:
        print(f"  request {v.request_id}: {v.detail}", flush=True)
    word = "PASS" if not failed else "FAIL"
    print(f"golden check {word}: {len(verdicts) - len(failed)}/{len(verdicts)} requests with {rule} "
          f"(GoldenDecoder, one process)", flush=True)
    return not failed
