"""A launched MoELayer against its single-process golden, on every rank (prints PASS / FAIL per call).

    pypto-launch --nproc N moe_layer.py [--names mixtral|deepseek] [--quantize] [--calls C] [--then <options> ...]

Every rank builds the same Hugging Face-style state dict from one seed; the layer loads only its own experts
(the test counts the expert tensors each rank touched), the golden loads them all. Token counts differ per
rank and per call (rank 1 has none on the first call). --then checks one more layer in the same job (as a model has
several; a rank's start-up is most of a small job's cost: tests/kernels/moe/launched_configs.py), its lines between
"rank r/n: CONFIG i begins" and "rank r/n: CONFIG i ends ok" (or "... ends not ok").
"""
import argparse
import sys

import torch

import pypto.language.distributed as pld
from pypto_rt.kernels.moe import MoEConfig, load_moe_weights
from pypto_rt.kernels.moe.golden import moe_layer_golden
from pypto_rt.kernels.moe import MoELayer

H, I, E_PER_RANK, K, T_MAX = 32, 48, 4, 3, 5
PROJECTIONS = {"mixtral": ("w1", "w3", "w2"), "deepseek": ("gate_proj", "up_proj", "down_proj")}


class CountingDict(dict):
    """A state dict that remembers which keys were read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def state_dict(names: str, experts: int, gen) -> CountingDict:
    gate_up, up, down = PROJECTIONS[names]
    sd = {"mlp.gate.weight": torch.randn(experts, H, generator=gen) * 0.5}
    for e in range(experts):
        sd[f"mlp.experts.{e}.{gate_up}.weight"] = torch.randn(I, H, generator=gen) / H ** 0.5
        sd[f"mlp.experts.{e}.{up}.weight"] = torch.randn(I, H, generator=gen) / H ** 0.5
        sd[f"mlp.experts.{e}.{down}.weight"] = torch.randn(H, I, generator=gen) / I ** 0.5
    if names == "deepseek":
        sd["mlp.gate.e_score_correction_bias"] = torch.randn(experts, generator=gen) * 0.1
        for proj in PROJECTIONS["deepseek"]:
            shape = (H, I) if proj == "down_proj" else (I, H)
            sd[f"mlp.shared_experts.{proj}.weight"] = torch.randn(*shape, generator=gen) / shape[1] ** 0.5
    return CountingDict(sd)


def check(args) -> dict:
    """{check name: passed} of one layer (see the module's text)."""
    me, world = pld.rank(), pld.world_size()
    experts = E_PER_RANK * world
    score = "sigmoid" if args.names == "deepseek" else "softmax"
    cfg = MoEConfig(hidden=H, num_experts=experts, top_k=K, max_tokens_per_rank=T_MAX, dtype=torch.bfloat16,
                    score_func=score, intermediate_size=I)
    gen = torch.Generator().manual_seed(99)
    sd = state_dict(args.names, experts, gen)
    layer = MoELayer.from_state_dict(cfg, sd, prefix="mlp.", quantize=args.quantize)
    mine = {f"mlp.experts.{e}." for e in range(me * E_PER_RANK, (me + 1) * E_PER_RANK)}
    touched = {k.rsplit(".", 2)[0] + "." for k in sd.read if k.startswith("mlp.experts.")}
    checks = {"loads only its own experts": touched == mine}
    everything = load_moe_weights(cfg, sd, rank=0, world=1, prefix="mlp.", quantize=args.quantize)
    for call in range(args.calls):
        tokens = [(call + 2 * r + 1) % (T_MAX + 1) for r in range(world)]
        if call == 0 and world > 1:
            tokens[1] = 0
        xs = [torch.randn(n, H, generator=gen).to(torch.bfloat16) for n in tokens]
        out = layer(xs[me])
        want = moe_layer_golden(cfg, everything, xs[me])
        checks[f"call {call}: matches the golden"] = out.shape == want.shape and torch.allclose(
            out.float(), want.float(), rtol=4e-2, atol=4e-2)
    return checks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", choices=sorted(PROJECTIONS), default="mixtral")
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    me, world = pld.rank(), pld.world_size()
    every_ok = True
    configs = [[]]
    for arg in sys.argv[1:]:
        if arg == "--then":
            configs.append([])
        else:
            configs[-1].append(arg)
    for i, argv in enumerate(configs):
        print(f"rank {me}/{world}: CONFIG {i} begins", flush=True)
        checks = check(ap.parse_args(argv))
        for name, ok in checks.items():
            print(f"rank {me}/{world}: {'PASS' if ok else 'FAIL'} {name}")
        every_ok &= all(checks.values())
        print(f"rank {me}/{world}: CONFIG {i} ends {'ok' if all(checks.values()) else 'not ok'}", flush=True)
    raise SystemExit(0 if every_ok else 1)


if __name__ == "__main__":
    main()
