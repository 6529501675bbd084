"""The flagship (issue 15): a stream of requests served by a small MoE decoder on every rank of a launched job,
checked token for token against the single-process golden model.

    pypto-launch --nproc 4 examples/serve/serve.py                 # FP32, about two minutes on a 2-core CPU
    pypto-launch --nproc 2 examples/serve/serve.py --size tiny --requests 6
    pypto-launch --nproc 4 examples/serve/serve.py --dtype bf16 --int8-experts

Attention is data-parallel: rank r serves requests r, r + N, ... with its own `Engine` and KV pool. The experts
are expert-parallel (`MoEDecoder`'s `MoELayer`s, experts split evenly across the ranks), so every rank steps
until every rank is done, an idle one with an empty batch: before each step the ranks all-reduce
(busy, finished, output tokens) on the job's communicator. Requests arrive at the step the workload gives them.
Rank 0 prints the progress while it runs and, at the end, the metrics gathered from every rank and the golden
check (PASS / FAIL for the whole run; the exit code is 1 on FAIL).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

if __package__ in (None, ""):          # run as a file (pypto-launch): the repo root holds `examples`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.serve.golden_check import check_all  # noqa: E402
from examples.serve.moe_timing import time_moe_layers  # noqa: E402
from examples.serve.progress import Progress  # noqa: E402
from examples.serve.report import RankReport, print_report  # noqa: E402
from examples.serve.workload import WorkloadShape, assign_rank, longest_request, make_workload  # noqa: E402
from pypto_rt.serving import Engine, EngineConfig, RankGroup  # noqa: E402
from pypto_rt.serving.model import DecoderConfig, GoldenDecoder, MoEDecoder, random_state_dict  # noqa: E402

# model sizes: DecoderConfig fields, the per-step token budget and batch rows, and the workload's lengths
SIZES = {
    "tiny": dict(model=dict(vocab_size=64, hidden=32, num_layers=1, num_q_heads=4, num_kv_heads=2, head_dim=8,
                            num_experts=8, top_k=2, moe_intermediate=32, shared_intermediate=32, block_size=4),
                 budget=32, max_batch=4, prompt_len=(3, 10), output_len=(3, 6), prefix_len=8),
    "default": dict(model=dict(vocab_size=512, hidden=128, num_layers=2, num_q_heads=8, num_kv_heads=2,
                               head_dim=16, num_experts=16, top_k=2, moe_intermediate=128, shared_intermediate=128,
                               block_size=16),
                    budget=128, max_batch=16, prompt_len=(8, 48), output_len=(8, 32), prefix_len=32),
}
# the golden check's logits tolerance: MoEDecoder's stated bounds against GoldenDecoder (README, decoder section)
TOLERANCE = {"fp32": 0.0, "bf16": 0.05, "fp32+int8": 0.15, "bf16+int8": 0.15}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="examples/serve/serve.py")
    p.add_argument("--size", choices=sorted(SIZES), default="default", help="model and workload size")
    p.add_argument("--requests", type=int, default=48, help="requests in the stream (default 48)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the workload (default 0)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="fp32 (default): tokens must equal the golden's; bf16: within a logits tolerance")
    p.add_argument("--int8-experts", action="store_true", help="W8A8 routed and shared experts (with a tolerance)")
    p.add_argument("--compile-kernels", action="store_true",
                   help="the engine's warm-up compiles every decode bucket's kernels (EngineConfig.compile_kernels)")
    p.add_argument("--mean-gap-steps", type=float, default=1.5, help="mean steps between arrivals (0: all at once)")
    p.add_argument("--progress-s", type=float, default=2.0, help="seconds between plain progress lines")
    p.add_argument("--json", metavar="PATH", help="rank 0 also writes the figures and the verdict to PATH")
    p.add_argument("--corrupt-request", type=int, default=None, metavar="ID",
                   help="self-test: change one served token of request ID before the check (the run must FAIL)")
    args = p.parse_args(argv)
    if args.requests < 1:
        p.error(f"--requests {args.requests}: needs at least 1")
    return args


def build_config(args: argparse.Namespace, world: int) -> tuple[DecoderConfig, dict, float]:
    """The decoder config, the size preset and the golden check's logits tolerance."""
    size = SIZES[args.size]
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    model = size["model"]
    if model["num_experts"] % world:
        raise SystemExit(f"serve.py: --size {args.size} has {model['num_experts']} experts, which {world} ranks "
                         "cannot split evenly; launch with a --nproc that divides it")
    cfg = DecoderConfig(**model, dtype=dtype, quantize=args.int8_experts, max_tokens_per_rank=size["budget"])
    kind = args.dtype + ("+int8" if args.int8_experts else "")
    return cfg, size, TOLERANCE[kind]


def serve(engine: Engine, mine: list, group: RankGroup, progress: Progress, total: int
          ) -> tuple[float, float, dict]:
    """Step until every rank is done, adding each request at its arrival step; returns the loop's seconds, the
    seconds of its all-reduces and this rank's requests by id."""
    pending, step, start = list(mine), 0, time.perf_counter()
    reqs, agree = {}, 0.0
    while True:
        while pending and pending[0].arrival_step <= step:
            w = pending.pop(0)
            reqs[w.request_id] = engine.add_request(list(w.prompt), w.max_new_tokens, request_id=w.request_id)
        m, before = engine.metrics, time.perf_counter()
        busy, finished, tokens = group.allreduce_sum([int(engine.has_unfinished() or bool(pending)),
                                                      m.finished, m.output_tokens])
        agree += time.perf_counter() - before
        progress.update(step, finished, total, tokens, time.perf_counter() - start)
        if busy == 0:
            break
        engine.step()
        step += 1
    progress.close()
    return time.perf_counter() - start, agree, reqs


def main(argv=None) -> int:
    args = parse_args(argv)
    group = RankGroup.of_this_job("examples/serve")
    rank, world = group.rank, group.world_size
    cfg, size, tolerance = build_config(args, world)
    shape = WorkloadShape(num_requests=args.requests, prompt_len=size["prompt_len"], output_len=size["output_len"],
                          prefix_len=size["prefix_len"], mean_gap_steps=args.mean_gap_steps)
    workload = make_workload(shape, cfg.vocab_size, args.seed)
    mine = [w for w in workload if assign_rank(w, world) == rank]
    state = random_state_dict(cfg, seed=args.seed)
    model = MoEDecoder(cfg, state)                     # COLLECTIVE: MoE windows on every rank
    blocks_per_request = -(-longest_request(workload) // cfg.block_size)
    engine = Engine(model, EngineConfig(num_blocks=blocks_per_request * size["max_batch"] + 8,
                                        max_batch=size["max_batch"], max_num_batched_tokens=size["budget"],
                                        max_model_len=blocks_per_request * cfg.block_size,
                                        compile_kernels=args.compile_kernels))
    if rank == 0:
        print(f"serving {len(workload)} requests on {world} rank(s): {describe(cfg)}", flush=True)
    moe_timer = time_moe_layers(model)      # after the engine's warm-up: the loop's MoE time only
    group.barrier("serve: start")
    seconds, agree, reqs = serve(engine, mine, group, Progress(rank == 0, args.progress_s), len(workload))
    served = {rid: (req.prompt_ids, list(req.output_ids), req.max_new_tokens) for rid, req in reqs.items()}
    if args.corrupt_request in served:
        corrupt(served, args.corrupt_request, cfg.vocab_size)
    verdicts = check_all(GoldenDecoder(cfg, state), served, tolerance)
    reports = group.gather(RankReport.of(rank, engine.metrics, seconds, agree, moe_timer.seconds, verdicts))
    ok = print_report(reports, tolerance, args.json) if rank == 0 else True
    passed = group.allreduce_sum([int(ok)])[0] == world
    return 0 if passed else 1


def corrupt(served: dict, request_id: int, vocab_size: int) -> None:
    """Replace the last served token of `request_id` with another id (the self-test of the check)."""
    prompt, tokens, expected = served[request_id]
    tokens = list(tokens)
    tokens[-1] = (tokens[-1] + 1) % vocab_size
    served[request_id] = (prompt, tokens, expected)


def describe(cfg: DecoderConfig) -> str:
    fields = dataclasses.asdict(cfg)
    keys = ("hidden", "num_layers", "num_experts", "top_k", "vocab_size", "block_size")
    dtype = str(cfg.dtype).removeprefix("torch.") + (", int8 experts" if cfg.quantize else "")
    return ", ".join(f"{k}={fields[k]}" for k in keys) + f", {dtype}"


if __name__ == "__main__":
    raise SystemExit(main())
