"""A decode step of MoEDecoder replays its MoE kernels on the compiled executor when the next step routes its tokens
to other experts: in one process the layer is one kernel (local_decode), which follows no count, so no guard
misses."""
import torch

from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import layer as layer_module
from pypto_rt.language import _runtime
from pypto_rt.language.decorators import KernelFunction
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.run_stats import REPLAYED
from pypto_rt.serving.batch import ForwardBatch
from pypto_rt.serving.model import DecoderConfig, MoEDecoder, random_state_dict

BATCH, CONTEXT, BLOCK = 4, 6, 4
MOE_KERNELS = ("local_decode_kernel",)
# engine runs, the recording, the trial's replays and engine runs, then replays only
STEPS = ReplayPolicy().normal_runs + 2 + 2 * ReplayPolicy().trial_replays + 3


def _decode_step(cfg, gen) -> ForwardBatch:
    """BATCH requests at CONTEXT tokens each decoding one new token (fresh ids: new routing)."""
    per = (CONTEXT + BLOCK) // BLOCK
    tables = torch.arange(BATCH * per, dtype=torch.int32).view(BATCH, per)
    slots = tables[:, CONTEXT // BLOCK].long() * BLOCK + CONTEXT % BLOCK
    return ForwardBatch(torch.randint(0, cfg.vocab_size, (BATCH,), generator=gen),
                        torch.full((BATCH,), CONTEXT, dtype=torch.int64), slots, tables,
                        torch.full((BATCH,), CONTEXT + 1, dtype=torch.int32),
                        torch.arange(BATCH + 1, dtype=torch.int32), True)


def test_decode_steps_with_new_routing_replay_the_moe_kernels(monkeypatch):
    kinds: dict[str, list] = {name: [] for name in MOE_KERNELS}
    for name in MOE_KERNELS:
        def built(*shape, _name=name, _factory=getattr(layer_module, name)):
            kernel = _factory(*shape)

            def noted(*args):
                with run_stats.collect() as stats:
                    result = kernel(*args)
                kinds[_name].append(stats.replay.kind)
                return result
            return noted
        monkeypatch.setattr(layer_module, name, built)
    cfg = DecoderConfig(vocab_size=64, hidden=32, num_layers=1, num_q_heads=4, num_kv_heads=2, head_dim=8,
                        num_experts=4, top_k=2, moe_intermediate=32, shared_intermediate=32, max_tokens_per_rank=32,
                        block_size=BLOCK)
    gen = torch.Generator().manual_seed(2)
    routings = []
    with config.scope(EXECUTOR="compiled"), policy_scope(slower=float("inf"), parallel=float("inf")):
        model = MoEDecoder(cfg, random_state_dict(cfg, seed=0))
        model.allocate_kv_cache(BATCH * ((CONTEXT + BLOCK) // BLOCK))
        for _ in range(STEPS):
            model.forward(_decode_step(cfg, gen))
            routings.append(tuple(model.moe[0].recv_counts.tolist()))
    assert len(set(routings[-3:])) > 1, routings          # the last steps route differently ...
    for name, seen in kinds.items():
        assert seen[-3:] == [REPLAYED] * 3, (name, seen)  # ... and still replay


def test_a_decode_step_on_one_rank_calls_four_kernels_per_layer_and_one_more(monkeypatch):
    """Stages that run back to back on the same rows are fused: [embedding / residual add, norm, QKV, RoPE, the
    cache write], the attention, [O proj, residual add, norm], the whole MoE layer, then [final norm, LM head,
    greedy] once (every row of a decode step is its request's last: no row gather)."""
    entries = []
    original = KernelFunction.__call__

    def counted(kernel, *args, **kwargs):
        if _runtime.active() is None:        # an entry called from plain Python
            entries.append(kernel.name.rsplit(".", 1)[-1])
        return original(kernel, *args, **kwargs)

    cfg = DecoderConfig(vocab_size=64, hidden=32, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=8,
                        num_experts=4, top_k=2, moe_intermediate=32, shared_intermediate=32, max_tokens_per_rank=32,
                        block_size=BLOCK)
    model = MoEDecoder(cfg, random_state_dict(cfg, seed=0))
    model.allocate_kv_cache(BATCH * ((CONTEXT + BLOCK) // BLOCK))
    monkeypatch.setattr(KernelFunction, "__call__", counted)
    model.forward(_decode_step(cfg, torch.Generator().manual_seed(3)))
    layer = ["paged_decode_attention", "out_proj_add_norm", "moe_local_decode"]
    assert entries == ["embed_qkv_rope_cache"] + layer + ["norm_qkv_rope_cache"] + layer + \
        ["norm_head_greedy_rows"], entries
