"""`MoELayer`: one MoE layer on this rank of an expert-parallel job, one call per decoder step.

    layer = MoELayer.from_state_dict(cfg, state_dict, prefix="model.layers.3.mlp.", quantize=True)   # collective
    out = layer(x)    # x [T, H] -> [T, H]: router -> gate -> dispatch -> routed experts -> combine (+ shared)

Each step runs the router GEMM, the gate, `MoEBuffer.dispatch`, the routed experts on the dispatch layout
(int8 when the weights are quantised, else the config's dtype), and `MoEBuffer.combine`, whose reduce also adds
the shared expert's output (computed on the local tokens), so the result is rounded once. In a job of one rank
(every expert local) a decode-sized call of bf16/FP32 experts skips the buffer: the whole layer is one kernel
(`local_decode.py`; for one token the hit experts only, `local_decode_hit.py`; for a batch each expert on its
own routes' slot rows, `local_decode_routed.py`). Every stage is a `@pl.jit` kernel: nothing is read to the host
(but the routed form's largest expert count, to rerun an overflowing batch densely), and the tensors a step needs
are the layer's own, so repeated steps with the same token count replay whatever the routing.
"""
import torch

import pypto.language.distributed as pld
from pypto_rt.kernels.layers.out_norm import check_out_proj, out_proj_add_norm
from pypto_rt.kernels.moe.buffer import MoEBuffer
from pypto_rt.kernels.moe.config import MoEConfig
from pypto_rt.kernels.moe.experts import run_experts, shared_expert
from pypto_rt.kernels.moe.gate import GateShape, check_bias, gate
from pypto_rt.kernels.moe.loading import load_moe_weights
from pypto_rt.kernels.moe.local_decode import (
    MAX_TOKENS as LOCAL_MAX_TOKENS, LocalDecodeShape, LocalDecodeWeights, local_decode_kernel,
)
from pypto_rt.kernels.moe.local_decode_hit import (
    HitForm, local_hit_kernel, local_route_kernel, out_proj_norm_route_kernel, uses_hit_experts,
)
from pypto_rt.kernels.moe.local_decode_routed import RoutedViews, capacity, local_routed_kernel, uses_routed
from pypto_rt.kernels.moe.moe_errors import MoEArgumentError, MoEConfigError, describe
from pypto_rt.kernels.moe.router import router_logits
from pypto_rt.kernels.moe.weights import MoEWeights


class MoELayer:
    def __init__(self, cfg: MoEConfig, weights: MoEWeights, *, buffer: MoEBuffer | None = None):
        """COLLECTIVE unless `buffer` is given (the layer's MoEBuffer allocates windows on every rank). `weights`:
        this rank's share (`load_moe_weights`): the router, experts rank * E_local .. + E_local - 1, the shared
        expert if any. Layers may share one buffer when their calls do not interleave."""
        if not isinstance(weights, MoEWeights):
            raise MoEConfigError(f"MoELayer takes MoEWeights (see load_moe_weights), got {type(weights).__name__}")
        self.buffer = buffer if buffer is not None else MoEBuffer(cfg)
        if self.buffer.cfg != cfg:
            raise MoEConfigError("MoELayer: the buffer was built for another MoEConfig",
                                 hint="build the MoEBuffer with the layer's config, or let the layer build it")
        first, local = self.buffer.rank * self.buffer.local_experts, self.buffer.local_experts
        if weights.first_expert != first or weights.experts.experts != local:
            raise MoEConfigError(
                f"rank {self.buffer.rank}: MoELayer: the weights hold experts {weights.first_expert}.."
                f"{weights.first_expert + weights.experts.experts - 1}, this rank owns {first}..{first + local - 1}",
                hint="load them with load_moe_weights(cfg, state_dict, rank=pld.rank(), world=pld.world_size())")
        check_bias(weights.router.bias, "MoELayer")
        layout = self.buffer.layout
        self._local = None      # the one-kernel layer's (fused weights, bias, shape, routed views), one rank
        if layout.world == 1 and not weights.experts.quantized and \
                (weights.shared is None or not weights.shared.quantized):
            fused, weights = LocalDecodeWeights.of(weights)
            bias = torch.zeros(cfg.num_experts) if weights.router.bias is None else weights.router.bias
            shared_inter = 0 if weights.shared is None else weights.shared.inter
            shape = LocalDecodeShape(GateShape.of(cfg), cfg.hidden, weights.experts.inter, shared_inter, cfg.dtype,
                                     weights.router.weight.dtype, cfg.swiglu_limit)
            self._local = (fused, bias.float().reshape(1, cfg.num_experts).contiguous(), shape,
                           RoutedViews.of(fused, shape))
        self.cfg, self.weights = cfg, weights
        self._expert_rows = torch.zeros(layout.local_experts, layout.lanes, cfg.hidden, dtype=cfg.dtype)
        self._recv_counts: torch.Tensor | None = None   # the buffer's counts after a dispatch, or
        self._local_routes: torch.Tensor | None = None  # the one-kernel call's topk_idx [T, K]

    @classmethod
    def from_state_dict(cls, cfg: MoEConfig, state_dict, *, prefix: str = "", quantize: bool = False,
                        buffer: MoEBuffer | None = None) -> "MoELayer":
        """COLLECTIVE: this rank loads its share of a Hugging Face-style state dict (Mixtral or DeepSeek names, see
        load_moe_weights), quantising its routed and shared experts to int8 when `quantize`."""
        weights = load_moe_weights(cfg, state_dict, rank=pld.rank(), world=pld.world_size(), prefix=prefix,
                                   quantize=quantize)
        return cls(cfg, weights, buffer=buffer)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] in cfg.dtype (T <= max_tokens_per_rank, may differ per rank, may be 0) -> [T, H]."""
        cfg, weights, buf = self.cfg, self.weights, self.buffer
        if self._local is not None and isinstance(x, torch.Tensor) and 0 < x.dim() and \
                0 < x.shape[0] <= min(LOCAL_MAX_TOKENS, cfg.max_tokens_per_rank):
            return self._one_kernel(x)
        self._local_routes = None
        logits = router_logits(weights.router.weight, x)
        topk_idx, topk_weights = gate(cfg, logits, weights.router.bias)
        recv = buf.dispatch(x, topk_idx, topk_weights)
        self._recv_counts = recv.counts
        # at decode sizes, experts hold about world * T rows: the decode form replays whatever the routing
        y = run_experts(cfg, weights.experts, recv.x, recv.counts, out=self._expert_rows,
                        rows_hint=buf.layout.world * x.shape[0])
        shared = shared_expert(cfg, weights.shared, x) if weights.shared is not None else None
        return buf.combine(y, recv.handle, add=shared)

    def _one_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The whole layer as one kernel (one rank, 1 <= T <= LOCAL_MAX_TOKENS, bf16/FP32 experts); for one token
        (K < E) the hit-experts form instead (local_decode_hit.py: a route kernel, then only the hit experts), for
        a batch the routed capacity form where it measured faster (local_decode_routed.py)."""
        cfg, weights = self.cfg, self.weights
        if x.dim() != 2 or x.shape[1] != cfg.hidden or x.dtype != cfg.dtype:
            raise MoEArgumentError.at_caller(f"MoELayer: x must be a {cfg.dtype} [T, {cfg.hidden}] tensor (the "
                                             f"config's dtype and hidden size), got {describe(x)}")
        fused, bias, shape, views = self._local
        tokens, x, router = x.shape[0], x.contiguous(), weights.router.weight.contiguous()
        out = torch.empty(tokens, cfg.hidden, dtype=cfg.dtype)
        routes = torch.empty(tokens, cfg.top_k, dtype=torch.int32)
        self._local_routes = routes
        if uses_hit_experts(shape, tokens):     # one token: read only its hit experts' weights (two kernels)
            route_weights = torch.empty(tokens, cfg.top_k, dtype=torch.float32)
            local_route_kernel(shape, tokens)(x, router, bias, routes, route_weights)
            local_hit_kernel(shape)(x, routes, route_weights, fused.gate_up, fused.down, out)
            return out
        if uses_routed(shape, tokens):
            slots = capacity(shape, tokens)
            counts = torch.empty(1, cfg.num_experts)
            local_routed_kernel(shape, tokens, slots)(x, router, bias, fused.gate_up, fused.down, views.gate,
                                                      views.up, views.down, out, routes, counts)
            if float(counts.max()) <= slots:      # else a route had no slot: the dense form computes every one
                return out
        local_decode_kernel(shape)(x, router, bias, fused.gate_up, fused.down, out, routes)
        return out

    def after_out_proj(self, attn: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor,
                       norm_weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """This layer on `kernels.layers.out_proj_add_norm(attn, w_o, residual, norm_weight, eps)` (residual <-
        attn @ w_o.T + residual in place; its RMSNorm is the layer's input) -> [T, H]. Where the layer runs one
        token's hit experts on one rank, the projection, the norm and the route are one kernel (the same
        roundings, one call fewer a decoder layer); otherwise the two calls."""
        tokens, k_in, hidden = check_out_proj("MoELayer.after_out_proj", attn, w_o, residual, norm_weight)
        cfg = self.cfg
        if self._local is None or attn.dtype != cfg.dtype or hidden != cfg.hidden or \
                not uses_hit_experts(self._local[2], tokens):
            return self(out_proj_add_norm(attn, w_o, residual, norm_weight, eps))
        fused, bias, shape, _ = self._local
        normed, out = torch.empty(1, hidden, dtype=cfg.dtype), torch.empty(1, hidden, dtype=cfg.dtype)
        routes = self._local_routes = torch.empty(1, cfg.top_k, dtype=torch.int32)
        route_weights = torch.empty(1, cfg.top_k, dtype=torch.float32)
        out_proj_norm_route_kernel(shape, k_in, float(eps))(
            attn.contiguous(), w_o.contiguous(), residual, norm_weight.view(1, hidden),
            self.weights.router.weight.contiguous(), bias, normed, routes, route_weights)
        local_hit_kernel(shape)(normed, routes, route_weights, fused.gate_up, fused.down, out)
        return out

    def one_token_form(self) -> HitForm | None:
        """What a kernel fusing this layer's one-token hit-experts form takes (kernels.decoder): the fused experts'
        gate_up and down, the router weight, its bias [1, E] FP32 and the LocalDecodeShape; None where the layer
        does not run that form for one token (several ranks, int8 experts, top_k equal to the experts)."""
        if self._local is None or not uses_hit_experts(self._local[2], 1):
            return None
        fused, bias, shape, _ = self._local
        return HitForm(fused.gate_up, fused.down, self.weights.router.weight.contiguous(), bias, shape)

    def note_routes(self, topk_idx: torch.Tensor) -> None:
        """The routes [1, K] INT32 a fused kernel ran this layer's one-token form with (recv_counts counts them)."""
        self._local_routes = topk_idx

    @property
    def recv_counts(self) -> torch.Tensor | None:
        """[E_local] INT32: rows the last call brought to each local expert (the buffer's tensor, valid until the
        buffer's next dispatch, any layer's; after a one-kernel call counted from its routing when asked)."""
        if self._local_routes is not None:
            return torch.bincount(self._local_routes.view(-1), minlength=self.cfg.num_experts).to(torch.int32)
        return self._recv_counts
