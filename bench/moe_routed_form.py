"""The one-rank MoE decode layer's dense form against its routed capacity form (kernels/moe/local_decode_routed.py),
alone and inside benchmark 12's decode step, in CPU time: one torch thread, `time.thread_time`, best of 7 rounds
of 5 calls, the two forms alternating in one process (the machine is shared: wall clock moves 2x between runs,
one thread's CPU time much less). Not part of `python -m bench`: it picks `ROUTED_MAX_ROW_SHARE`.

    .venv/bin/python -m bench.moe_routed_form [batch ...]      (default 8 16 32)
"""
from __future__ import annotations

import itertools
import sys
import time

import torch

from bench.serving_step import CONTEXT, WARMUP, EagerDecoder, _config, _decode_batch

ROUNDS, CALLS = 7, 5


def _cpu_best(fns: dict) -> dict[str, float]:
    """Best-of-ROUNDS CPU seconds per call of each function, the functions alternating round by round."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            start = time.thread_time()
            for _ in range(CALLS):
                fn()
            best[name] = min(best[name], (time.thread_time() - start) / CALLS)
    return best


def _form(name: str):
    """Select a form for every batch from now on (the layer reads ROUTED_MAX_ROW_SHARE per call)."""
    from pypto_rt.kernels.moe import local_decode_routed
    local_decode_routed.ROUTED_MAX_ROW_SHARE = 1.0 if name == "routed" else 0.0


def _both(fn):
    def run(name):
        def call():
            _form(name)
            return fn()
        return call
    return {"dense": run("dense"), "routed": run("routed")}


def run(batches=(8, 16, 32)) -> str:
    from pypto_rt import config
    from pypto_rt.serving.model import GoldenDecoder, MoEDecoder, random_state_dict

    torch.set_num_threads(1)
    cfg = _config()
    sd = random_state_dict(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    golden = GoldenDecoder(cfg, sd)
    lines = ["| batch | MoE layer dense | routed | decode step dense | routed | eager torch step | step / torch, dense "
             "| routed |", "|---|---|---|---|---|---|---|---|"]
    with config.scope(EXECUTOR="compiled"):
        model = MoEDecoder(cfg, sd)
        for batch in batches:
            step, per = _decode_batch(cfg, batch)
            model.allocate_kv_cache(batch * per)
            model.key_pool.copy_(torch.randn(model.key_pool.shape, generator=gen))
            model.value_pool.copy_(torch.randn(model.value_pool.shape, generator=gen))
            xs = itertools.cycle([torch.randn(batch, cfg.hidden, generator=gen) for _ in range(64)])   # new routing
            layer = _both(lambda: model.moe[0](next(xs)))
            eager = EagerDecoder(cfg, golden, batch, gen)
            steps = {**_both(lambda: model.forward(step)), "torch": lambda: eager.step(step.input_ids, step.positions)}
            for fn in list(layer.values()) + list(steps.values()):
                for _ in range(WARMUP):         # past recording and the replay trial
                    fn()
            t_layer, t_step = _cpu_best(layer), _cpu_best(steps)
            lines.append(f"| {batch} | {t_layer['dense'] * 1e3:.3f} ms | {t_layer['routed'] * 1e3:.3f} ms | "
                         f"{t_step['dense'] * 1e3:.2f} ms | {t_step['routed'] * 1e3:.2f} ms | "
                         f"{t_step['torch'] * 1e3:.2f} ms | {t_step['dense'] / t_step['torch']:.2f}x | "
                         f"{t_step['routed'] / t_step['torch']:.2f}x |")
    lines.append(f"\nCPU time per call, one torch thread, best of {ROUNDS} x {CALLS}; the layer over 64 inputs in turn "
                 f"(the routing changes, overflow included), the step at context {CONTEXT}.")
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(tuple(int(b) for b in sys.argv[1:]) or (8, 16, 32)))
