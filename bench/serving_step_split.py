"""Where benchmark 12's decode step spends its CPU time, per part, with the compiled tier off (replays): each
layer-level call the decoder makes (its host checks and outputs, then its kernel calls), of that the kernel calls
(`KernelFunction.__call__`: the settled entry, argument matching, the replay), of that the replayed torch calls
alone; the rest of the step is the decoder's own Python. Next to it the eager torch step (benchmark 12's
baseline). CPU time (`time.thread_time`, one torch thread), STEPS steps after the serving loop's warm-up; the
wrappers cost ~1 µs a call. Then the one-token MoE layer's gate / up weight reads from cold caches in the fused
layout against contiguous blocks (`cold_reads`), and what the settled calls' argument matching costs a step (a
probe that skips it). Not part of `python -m bench`: a probe for issue 15's batch 1.

    PYPTO_TIER=off .venv/bin/python -m bench.serving_step_split [batch ...] [--per-stage]     (default 1)

At batch 1 the decoder runs its one-token kernels (L + 1 calls a step, kernels.decoder); --per-stage times the
per-stage kernels instead (4 L + 1 calls, MoEDecoder(one_token_kernels=False)).
"""
from __future__ import annotations

import collections
import inspect
import statistics
import sys
import time

import torch

from bench.serving_step import WARMUP, EagerDecoder, _config, _decode_batch

STEPS, ROUNDS = 100, 5
PARTS = ("embed_norm_qkv_rope_cache", "norm_qkv_rope_cache", "out_proj_add_norm", "norm_head_greedy")


class _Clock:
    """CPU seconds and calls per name, summed over the wrapped calls."""

    def __init__(self):
        self.seconds, self.calls = collections.Counter(), collections.Counter()

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.thread_time() - start
                self.calls[name] += 1
        return timed


def _settled(kernel) -> list:
    """The settled closures of `kernel` (replay.settled's chain: each closure's `other`)."""
    chain, settled = [], kernel.state.settled
    while settled is not None and hasattr(settled, "spec"):
        chain.append(settled)
        settled = inspect.getclosurevars(settled).nonlocals.get("other")
    return chain


def _kernels(model, step) -> dict:
    """The kernels one step calls, by name."""
    from pypto_rt.language.decorators import KernelFunction
    kernels, call = {}, KernelFunction.__call__

    def seen(self, *args, **kwargs):
        kernels[self.name] = self
        return call(self, *args, **kwargs)

    KernelFunction.__call__ = seen
    try:
        model.forward(step)
    finally:
        KernelFunction.__call__ = call
    return kernels


def _matching_cost(model, step, rounds: int = 15) -> str:
    """What the settled calls' argument matching costs a step: steps with it, then with every settled closure's
    `matches` answering yes unchecked (a probe only: the arguments are the same every step), alternating; the
    median of the paired differences and the best of each."""
    cells = []
    for kernel in _kernels(model, step).values():
        for settled in _settled(kernel):
            cell = dict(zip(settled.__code__.co_freevars, settled.__closure__))["matches"]
            cells.append((cell, cell.cell_contents))
    with_it, without = [], []
    for _ in range(rounds):
        with_it.append(_best(lambda: model.forward(step), 1))
        for cell, _ in cells:
            cell.cell_contents = _always
        try:
            without.append(_best(lambda: model.forward(step), 1))
        finally:
            for cell, matches in cells:
                cell.cell_contents = matches
    paired = statistics.median(a - b for a, b in zip(with_it, without))
    return (f"argument matching ({len(cells)} settled closures): {paired * 1e3:.3f} ms a step (median paired "
            f"difference; best {min(with_it) * 1e3:.3f} ms with it, {min(without) * 1e3:.3f} ms without)")


def _always(args) -> bool:
    return True


def _split(model, step, clock: _Clock) -> None:
    """Run STEPS steps with every layer-level call, kernel call and settled replay timed (restored after)."""
    import pypto_rt.serving.model.decoder as decoder
    from pypto_rt.kernels import attention
    from pypto_rt.kernels.moe.layer import MoELayer
    from pypto_rt.language.decorators import KernelFunction
    from pypto_rt.serving.model.one_token_step import OneTokenStep

    saved = [(decoder, name, getattr(decoder, name)) for name in PARTS]
    saved += [(attention, "paged_decode_attention", attention.paged_decode_attention),
              (MoELayer, "__call__", MoELayer.__call__), (MoELayer, "after_out_proj", MoELayer.after_out_proj),
              (OneTokenStep, "run", OneTokenStep.run), (KernelFunction, "__call__", KernelFunction.__call__)]
    call, replays = KernelFunction.__call__, []
    for name, kernel in _kernels(model, step).items():
        for spec in (settled.spec for settled in _settled(kernel)):
            replays.append((spec, spec.replay))
            spec.replay = clock.wrap("replay " + name.split(".")[0], spec.replay)
    try:
        for owner, name, fn in saved[:-1]:
            setattr(owner, name, clock.wrap("layer " + {"__call__": "moe", "after_out_proj": "moe after_out_proj",
                                                         "run": "one_token run"}.get(name, name), fn))

        def kernel_call(self, *args, **kwargs):
            start = time.thread_time()
            try:
                return call(self, *args, **kwargs)
            finally:
                name = "kernel " + self.name.split(".")[0]
                clock.seconds[name] += time.thread_time() - start
                clock.calls[name] += 1

        KernelFunction.__call__ = kernel_call
        start = time.thread_time()
        for _ in range(STEPS):
            model.forward(step)
        clock.seconds["step"] += time.thread_time() - start
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        for spec, fn in replays:
            spec.replay = fn


def _best(fn, rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(STEPS // ROUNDS):
            fn()
        best = min(best, (time.thread_time() - start) / (STEPS // ROUNDS))
    return best


def cold_reads(rounds: int = 7, calls: int = 40) -> str:
    """The one-token MoE layer's gate / up GEMVs (two hit experts and the shared one, benchmark 12's sizes) with
    the caches flushed before each set (a 32 MiB write): six over gate and up column blocks apart in a K-major
    [H, 2 N] (the fused layout before 2026-12-03 08:20 UTC: 1 KiB runs at a 2 N * 4-byte stride), three over each
    expert's gate | up side by side (local_decode.py's layout: 2 KiB runs at that stride), against three over the
    same blocks stored contiguous [H, 2 I] each. CPU time, best of `rounds` means over `calls` sets."""
    cfg = _config()
    hidden, inter, experts = cfg.hidden, cfg.moe_intermediate, cfg.num_experts
    width = (experts + 1) * inter
    gate_up, blocks = torch.randn(hidden, 2 * width), torch.randn(experts + 1, hidden, 2 * inter)
    x, flush = torch.randn(1, hidden), torch.randn(8 << 20)
    hit = (1, 4, experts)
    columns = [e * inter + up * width for e in hit for up in (0, 1)]
    sets = {"gate and up apart": lambda: [torch.mm(x, gate_up[:, c:c + inter]) for c in columns],
            "side by side": lambda: [torch.mm(x, gate_up[:, 2 * e * inter:2 * (e + 1) * inter]) for e in hit],
            "contiguous blocks": lambda: [torch.mm(x, blocks[e]) for e in hit]}
    best = dict.fromkeys(sets, float("inf"))
    for _ in range(rounds):
        for name, fn in sets.items():
            spent = 0.0
            for _ in range(calls):
                flush.add_(1.0)
                start = time.thread_time()
                fn()
                spent += time.thread_time() - start
            best[name] = min(best[name], spent / calls)
    return "cold gate / up GEMVs of one token (a layer): " + ", ".join(
        f"{name} {seconds * 1e6:.0f} us" for name, seconds in best.items())


def run(batch: int, one_token: bool = True) -> str:
    from pypto_rt import config
    from pypto_rt.serving.model import GoldenDecoder, MoEDecoder, random_state_dict

    torch.set_num_threads(1)
    cfg = _config()
    sd = random_state_dict(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    with config.scope(EXECUTOR="compiled"):
        model = MoEDecoder(cfg, sd, one_token_kernels=one_token)
        step, per = _decode_batch(cfg, batch)
        model.allocate_kv_cache(batch * per)
        eager = EagerDecoder(cfg, GoldenDecoder(cfg, sd), batch, gen)
        for _ in range(WARMUP):
            model.forward(step)
        decoder_s, eager_s = _best(lambda: model.forward(step)), _best(lambda: eager.step(step.input_ids,
                                                                                           step.positions))
        clock = _Clock()
        _split(model, step, clock)
        matching = _matching_cost(model, step)
    per_step = {name: s / STEPS * 1e3 for name, s in clock.seconds.items()}
    lines = [f"batch {batch}: decoder {decoder_s * 1e3:.3f} ms, eager torch {eager_s * 1e3:.3f} ms "
             f"({decoder_s / eager_s:.2f}x; best of {ROUNDS} x {STEPS // ROUNDS} steps, CPU time); timed split "
             f"step {per_step.pop('step'):.3f} ms", "", "| part | calls / step | CPU ms / step |", "|---|---|---|"]
    for name in sorted(per_step, key=lambda n: (n.split()[0] != "layer", n)):
        lines.append(f"| {name} | {clock.calls[name] / STEPS:.0f} | {per_step[name]:.3f} |")
    return "\n".join(lines + ["", matching])


if __name__ == "__main__":
    torch.set_num_threads(1)
    per_stage = "--per-stage" in sys.argv         # MoEDecoder(one_token_kernels=False): the per-stage kernels
    for size in [int(a) for a in sys.argv[1:] if a != "--per-stage"] or [1]:
        print(run(size, not per_stage), "\n")
    print(cold_reads())
