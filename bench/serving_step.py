"""Benchmark 12 - one decode step of `MoEDecoder` on one rank (a plain process: MoE through the local transport)
against the same model written as an eager torch user would (issue 15, target <= 1.5x): batched torch ops, one
SDPA call over a contiguous per-request cache padded to the longest context, the MoE as Hugging Face's loop over
the experts (the routed rows gathered per expert on the host). Batch 1, 8 and 32, every request at CONTEXT tokens.
Per batch the decoder is timed twice against the torch step: with the compiled tier off (replayed kernels: the
default, background, until a replay has paid for a compile, which these few calls do not), then after the serving
runner's compiling warm-up (ModelRunner's: `compile_steps()` steps under the tier's eager mode; its time is
reported, not timed with the step).

    .venv/bin/python -m bench --only serving_step      (or python -m bench.serving_step)
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from bench.timing import interleaved, ms, ratio, table

TITLE = "12. A decode step of the MoE decoder against eager torch"
CONTEXT = 96
BATCHES = (1, 8, 32)
WARMUP = 12


def _config():
    from pypto_rt.serving.model import DecoderConfig
    return DecoderConfig(vocab_size=1024, hidden=256, num_layers=2, num_q_heads=8, num_kv_heads=2, head_dim=32,
                         num_experts=8, top_k=2, moe_intermediate=256, shared_intermediate=256,
                         max_tokens_per_rank=64, block_size=16, dtype=torch.float32)


class EagerDecoder:
    """The decoder's maths in eager torch over contiguous caches [B, KVH, S, D] per layer (the baseline)."""

    def __init__(self, cfg, golden, batch: int, gen, context: int = CONTEXT):
        self.cfg, self.w, self.moe, self.cos_sin = cfg, golden.weights, golden.moe, golden.cos_sin
        self.context = context
        shape = (batch, cfg.num_kv_heads, context + 1, cfg.head_dim)
        self.keys = [torch.randn(shape, generator=gen) for _ in range(cfg.num_layers)]
        self.values = [torch.randn(shape, generator=gen) for _ in range(cfg.num_layers)]

    def _norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps) * weight

    def _rope(self, x, positions):
        half = self.cfg.head_dim // 2
        cos, sin = self.cos_sin[positions, :half].unsqueeze(1), self.cos_sin[positions, half:].unsqueeze(1)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _moe(self, layer, x):
        weights = self.moe[layer]
        probs = F.linear(x, weights.router.weight).softmax(dim=-1)
        top_w, top_i = probs.topk(self.cfg.top_k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        experts = weights.experts
        for e in top_i.unique().tolist():                     # Hugging Face's loop over the hit experts
            rows, slot = (top_i == e).nonzero(as_tuple=True)
            h = F.silu(F.linear(x[rows], experts.w_gate[e])) * F.linear(x[rows], experts.w_up[e])
            out.index_add_(0, rows, F.linear(h, experts.w_down[e]) * top_w[rows, slot, None])
        shared = weights.shared
        return out + F.linear(F.silu(F.linear(x, shared.w_gate[0])) * F.linear(x, shared.w_up[0]), shared.w_down[0])

    def step(self, ids, positions):
        cfg, w = self.cfg, self.w
        b, qh, kvh, d = ids.shape[0], cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        hidden = F.embedding(ids, w.embed)
        residual = None
        for layer, lw in enumerate(w.layers):
            residual = hidden if residual is None else hidden + residual
            qkv = F.linear(self._norm(residual, lw.input_norm), lw.w_qkv)
            q = self._rope(qkv[:, :qh * d].view(b, qh, d), positions)
            k = self._rope(qkv[:, qh * d:(qh + kvh) * d].view(b, kvh, d), positions)
            rows = torch.arange(b)
            self.keys[layer][rows, :, positions] = k
            self.values[layer][rows, :, positions] = qkv[:, (qh + kvh) * d:].view(b, kvh, d)
            visible = torch.arange(self.context + 1)[None, :] <= positions[:, None]
            attn = F.scaled_dot_product_attention(q.unsqueeze(2), self.keys[layer], self.values[layer],
                                                  attn_mask=visible[:, None, None, :], enable_gqa=True)
            hidden = F.linear(attn.reshape(b, qh * d), lw.w_o)
            residual = hidden + residual
            hidden = self._moe(layer, self._norm(residual, lw.post_norm))
        logits = F.linear(self._norm(hidden + residual, w.final_norm), w.lm_head)
        return logits.argmax(dim=-1)


def _decode_batch(cfg, batch: int):
    from pypto_rt.serving.batch import ForwardBatch
    per = (CONTEXT + cfg.block_size) // cfg.block_size
    tables = torch.arange(batch * per, dtype=torch.int32).view(batch, per)
    positions = torch.full((batch,), CONTEXT, dtype=torch.int64)
    slots = tables[:, CONTEXT // cfg.block_size].long() * cfg.block_size + CONTEXT % cfg.block_size
    return ForwardBatch(torch.randint(0, cfg.vocab_size, (batch,)), positions, slots, tables,
                        torch.full((batch,), CONTEXT + 1, dtype=torch.int32),
                        torch.arange(batch + 1, dtype=torch.int32), True, max_seq_len=CONTEXT + 1), per


def run(repeats: int = 5) -> str:
    from pypto_rt import config
    from pypto_rt.replay.policy import policy_scope
    from pypto_rt.serving.model_runner import compile_steps
    from pypto_rt.serving.model import GoldenDecoder, MoEDecoder, random_state_dict

    cfg = _config()
    sd = random_state_dict(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    golden = GoldenDecoder(cfg, sd)
    rows = []
    with config.scope(EXECUTOR="compiled"):
        model = MoEDecoder(cfg, sd)
        for batch in BATCHES:
            step, per = _decode_batch(cfg, batch)
            model.allocate_kv_cache(batch * per)
            model.key_pool.copy_(torch.randn(model.key_pool.shape, generator=gen))
            model.value_pool.copy_(torch.randn(model.value_pool.shape, generator=gen))
            eager = EagerDecoder(cfg, golden, batch, gen)
            for _ in range(WARMUP):                 # past recording and the replay trial: a serving loop's steady state
                model.forward(step)
            steps = {"decoder": lambda: model.forward(step),
                     "torch": lambda: eager.step(step.input_ids, step.positions)}
            off = interleaved(steps, repeats)
            start = time.perf_counter()
            with policy_scope(tier="eager"):        # the compiling warm-up of EngineConfig(compile_kernels=True)
                for _ in range(compile_steps()):
                    model.forward(step)
            warmup_s = time.perf_counter() - start
            on = interleaved(steps, repeats)
            rows.append([str(batch), ms(off["decoder"]), ms(on["decoder"]), f"{ms(off['torch'])} / {ms(on['torch'])}",
                         ratio(off["decoder"] / off["torch"]), ratio(on["decoder"] / on["torch"]), f"{warmup_s:.1f} s"])
    return "\n".join([
        table(["batch", "MoEDecoder step, tier off", "tier on", "eager torch step (with off / on)",
               "decoder / torch, tier off (target <= 1.5x)", "tier on", "compiling warm-up"], rows), "",
        f"Shapes: V={cfg.vocab_size}, H={cfg.hidden}, {cfg.num_layers} layers, {cfg.num_q_heads}/{cfg.num_kv_heads} "
        f"heads of {cfg.head_dim}, {cfg.num_experts} experts top-{cfg.top_k} (I={cfg.moe_intermediate}) + a shared "
        f"expert, FP32, context {CONTEXT}, block {cfg.block_size}; one rank, not launched. Tier on: after the "
        "compiling warm-up (its time includes inductor's compiles, or their loading from its disk cache)."])


if __name__ == "__main__":
    print(f"## {TITLE}\n\n{run()}")
