"""Launched MoE dispatch + combine, checked on every rank against torch (prints PASS / FAIL per check).

    pypto-launch --nproc N dispatch_combine.py [--hidden H] [--experts-per-rank E] [--top-k K] [--calls C]
                                               [--routing uniform|skewed|mixed] [--dtype bf16|fp32]
                                               [--form auto|fixed|live] [--steady] [--sum-chunk N] [--inf-row]
                                               [--sums every|live|auto]
                                               [--tier] [--then <another configuration's options> ...]

Each rank draws the whole job's routing from one seed, so every rank can compute the golden of every other. Token
counts differ per rank and per call (rank 1 has none on the first call); --routing mixed takes skewed routing on odd
calls (an expert's row count jumps between a few rows and every arrival slot). The "expert" multiplies its rows by
(global expert id + 1), so combine must give out[t] = sum_k w[t, k] * x[t] * (e[t, k] + 1) (+ x[t] on the second call,
which passes it as `add`; the expert rows past recv.counts are NaN, which combine must not read), and recv.counts must
equal the job's route counts per local expert; neither call may read data on the host. Exit 0 when every check
passes. --form picks the receive side's form (dispatch.Layout.fixed_shape; auto: by size);
--steady keeps each rank's token count from call to call (the routing still changes), so calls from the fifth
on replay, and checks that they do. --sum-chunk sets the collective form's tokens per weighted-sum pass
(dispatch_parts.SUM_CHUNK), so small jobs take several passes and a short last one (the window form's live sums
take each group of arrivals in one pass).
--inf-row sets the first row of each rank's last local expert to +inf: the token whose route it is must combine to
+inf (a sum over its live routes), never NaN (a dead route slot read as that row with weight 0: 0 * inf).
--tier (with --steady) builds the buffer and calls it with PYPTO_TIER=eager (replay.tier: the replays compiled and
checked against the replay when recorded; a live layout then combines in two kernels, dispatch.combine_send_kernel's
sums over every route slot, unless dispatch.Layout.live_sums) and runs every later call compiled (the tiers swapped
in, as bench.moe_rank's timed calls), checking that every kernel has a compiled tier and that those calls stay exact.
--sums every|live|auto sets which sums a compiled live layout takes (dispatch.COMPILED_SUMS; default: the module's).
--staging live|pairs stages a live layout's token rows per destination, live pairs only, or by one scatter of every
pair (dispatch.LIVE_STAGING_BYTES 0 or past any layout; default: the module's, Layout.live_staging).
--then runs one more configuration in the same job, on a buffer of its own (a rank's start-up, mostly the torch import,
is most of a small job's cost: tests/kernels/moe/launched_configs.py). Each configuration's lines lie between
"rank r/n: CONFIG i begins" and "rank r/n: CONFIG i ends ok" (or "... ends not ok"); the compiled dispatch and combine
are cached per layout, and the form is not part of it, so two configurations of one job must differ in layout.
"""
import argparse
import contextlib
import sys

import torch

import pypto.language.distributed as pld
from pypto_rt import config, run_stats
from pypto_rt.kernels.moe import MoEBuffer, MoEConfig, dispatch, dispatch_parts
from pypto_rt.ops import distributed
from pypto_rt.replay.policy import ReplayPolicy
from pypto_rt.run_stats import REPLAYED

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def routing(world, experts, top_k, tokens, skewed, gen):
    """[tokens, top_k] distinct expert ids per token; skewed: every route on rank 0's experts."""
    pool = experts // world if skewed else experts
    return torch.stack([torch.randperm(pool, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32) \
        if tokens else torch.zeros(0, top_k, dtype=torch.int32)


def _inf_tokens(idxs, counts, me, e_local) -> list[int]:
    """This rank's tokens that hold the first row of some rank's last local expert (--inf-row): per expert, the
    first token in (rank, token) order routed to it."""
    world, mine = len(counts), []
    for d in range(world):
        expert = d * e_local + e_local - 1
        first = next(((r, t) for r in range(world) for t in range(counts[r]) if (idxs[r][t] == expert).any()), None)
        if first is not None and first[0] == me:
            mine.append(first[1])
    return mine


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts-per-rank", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--routing", choices=["uniform", "skewed", "mixed"], default="uniform")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--form", choices=["auto", "fixed", "live"], default="auto")
    ap.add_argument("--steady", action="store_true")
    ap.add_argument("--sum-chunk", type=int, default=None)
    ap.add_argument("--sums", choices=["default", "every", "live", "auto"], default="default")
    ap.add_argument("--inf-row", action="store_true")
    ap.add_argument("--staging", choices=["auto", "pairs", "live"], default="auto")
    ap.add_argument("--tier", action="store_true")
    return ap


# the module settings a configuration may change, as imported: each configuration starts from them
DEFAULTS = (dispatch_parts.SUM_CHUNK, dispatch.FIXED_SHAPE_BYTES, dispatch.FIXED_SHAPE_MAX_WORLD,
            dispatch.COMPILED_SUMS, dispatch.LIVE_STAGING_BYTES)


def check(args, buf) -> dict:
    """{check name: passed} of `args.calls` dispatch + combine calls on `buf` (see the module's text)."""
    me, world = pld.rank(), pld.world_size()
    experts, dtype = buf.cfg.num_experts, buf.cfg.dtype
    gen = torch.Generator().manual_seed(2024)
    e_local = experts // world
    checks = {}
    for call in range(args.calls):
        counts = [((2 * r + 1) if args.steady else (call + 2 * r)) % (args.max_tokens + 1) for r in range(world)]
        if call == 0 and world > 1 and not args.steady:
            counts[1] = 0
        xs = [torch.randn(n, args.hidden, generator=gen).to(dtype) for n in counts]
        skewed = args.routing == "skewed" or (args.routing == "mixed" and call % 2 == 1)
        idxs = [routing(world, experts, args.top_k, n, skewed, gen) for n in counts]
        ws = [torch.rand(n, args.top_k, generator=gen) for n in counts]
        compiled = args.tier and _compiled(buf)
        if args.tier and call == args.calls - 1:
            checks["both kernels compiled"] = compiled
        with run_stats.collect() as dispatched:
            recv = buf.dispatch(xs[me], idxs[me], ws[me])
        every = torch.cat(idxs).long()
        want_counts = torch.bincount(every.reshape(-1), minlength=experts)[me * e_local:(me + 1) * e_local]
        checks[f"call {call}: recv.counts"] = torch.equal(recv.counts.long(), want_counts)
        scale = (torch.arange(e_local) + me * e_local + 1).to(dtype).view(e_local, 1, 1)
        y = (recv.x.float() * scale.float()).to(dtype)
        for e in range(e_local):   # rows past the counts are nobody's: combine must not read them (0 * NaN = NaN)
            y[e, int(recv.counts[e]):] = float("nan")
        live_ok = True
        for e in range(e_local):   # the rows of expert e are the job's tokens routed to it, in (rank, token) order
            rows = [xs[r][t] for r in range(world) for t in range(counts[r]) if (idxs[r][t] == me * e_local + e).any()]
            got = recv.x[e, :len(rows)]
            live_ok &= len(rows) == int(recv.counts[e]) and (not rows or torch.equal(got, torch.stack(rows)))
        checks[f"call {call}: recv.x rows in (rank, token) order"] = live_ok
        if args.inf_row and int(recv.counts[e_local - 1]) > 0:
            y[e_local - 1, 0] = float("inf")
        with run_stats.collect() as combined:
            out = buf.combine(y, recv.handle, add=xs[me] if call == 1 else None)
        checks[f"call {call}: no host reads"] = dispatched.host_reads == combined.host_reads == 0
        if args.steady and not args.tier and call > ReplayPolicy().normal_runs + 1:   # (after the engine runs and
            # two recordings; compiled, a small kernel's trial turns run it on the engine now and then)
            # the signalling regions are recorded calls (replay.comm_block; the puts' extents are row counts read
            # from data); the live form's expansion and sums take rows whose counts the call computed
            # (replay.late_rows): recorded torch calls too, no block called as it is in either form
            checks[f"call {call}: replayed"] = dispatched.replay.kind == combined.replay.kind == REPLAYED and not any(
                "called as they are" in d.replay.reason for d in (dispatched, combined))
        mult = (idxs[me].float() + 1) * ws[me]
        want = xs[me].float() * (mult.sum(dim=1, keepdim=True) + (1 if call == 1 else 0))   # call 1 adds x
        if args.inf_row:
            want[_inf_tokens(idxs, counts, me, e_local)] = float("inf")
        tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
        checks[f"call {call}: combine"] = list(out.shape) == [counts[me], args.hidden] and torch.allclose(
            out.float(), want, rtol=tol, atol=tol)
    return checks


def _compiled(buf) -> bool:
    """Swap in the compiled tier of the buffer's kernels where built; whether every one is: the dispatch and the
    combine, or the combine's two kernels in its place (a live layout summing over every route slot)."""
    layout = buf.layout
    combine = (dispatch.combine_send_kernel(layout), dispatch.combine_reduce_kernel(layout)) \
        if buf.transport.split_combine else (dispatch.combine_kernel(layout),)
    kernels = (dispatch.dispatch_kernel(layout), *combine)
    tiers = [spec.tier for k in kernels for spec in k.state.replay.values() if spec.tier is not None]
    for tier in tiers:
        if tier.tiered is not None:
            tier.chosen = tier.tiered
    return len(tiers) == len(kernels) and all(tier.tiered is not None for tier in tiers)


def _buffer(args) -> MoEBuffer:
    """The configuration's buffer, after its module settings."""
    (dispatch_parts.SUM_CHUNK, dispatch.FIXED_SHAPE_BYTES, dispatch.FIXED_SHAPE_MAX_WORLD,
     dispatch.COMPILED_SUMS, dispatch.LIVE_STAGING_BYTES) = DEFAULTS
    if args.sum_chunk is not None:
        dispatch_parts.SUM_CHUNK = args.sum_chunk
    if args.form != "auto":
        dispatch.FIXED_SHAPE_BYTES = 1 << 62 if args.form == "fixed" else 0
        dispatch.FIXED_SHAPE_MAX_WORLD = 1 << 30
    if args.sums != "default":
        dispatch.COMPILED_SUMS = args.sums
    if args.staging != "auto":
        dispatch.LIVE_STAGING_BYTES = 0 if args.staging == "live" else 1 << 62
    experts = args.experts_per_rank * pld.world_size()
    return MoEBuffer(MoEConfig(hidden=args.hidden, num_experts=experts, top_k=args.top_k,
                               max_tokens_per_rank=args.max_tokens, dtype=DTYPES[args.dtype]))


@contextlib.contextmanager
def counted_copies(row_bytes: int):
    """[n]: how many one-sided byte copies (a put's or store's kept plan: ops.distributed._memmove) moved at least
    `row_bytes` inside the block: with the staging in the peers' windows (dispatch.peer_staging) no put copies a
    token row, only the count row and the meta rows (narrower than a token row at these sizes) cross."""
    real, copies = distributed._memmove, [0]

    def counting(target: int, source: int, nbytes: int):
        copies[0] += nbytes >= row_bytes
        return real(target, source, nbytes)
    distributed._memmove = counting
    try:
        yield copies
    finally:
        distributed._memmove = real


def _configurations(argv: list[str]) -> list[list[str]]:
    parts = [[]]
    for arg in argv:
        if arg == "--then":
            parts.append([])
        else:
            parts[-1].append(arg)
    return parts


def main():
    me, world = pld.rank(), pld.world_size()
    every_ok, layouts = True, set()
    for i, argv in enumerate(_configurations(sys.argv[1:])):
        args = _parser().parse_args(argv)
        with config.scope(**({"TIER": "eager"} if args.tier else {})):   # (the buffer picks its kernels by it)
            buf = _buffer(args)
            if buf.layout in layouts:
                raise SystemExit(f"configuration {i} ({' '.join(argv)}) repeats an earlier one's layout: the "
                                 "compiled dispatch and combine are cached per layout (not per form); give each a "
                                 "different size")
            layouts.add(buf.layout)
            print(f"rank {me}/{world}: CONFIG {i} begins", flush=True)
            with counted_copies(args.hidden * buf.cfg.dtype.itemsize) as copies:
                checks = check(args, buf)
            staged = getattr(buf.transport, "peer_staged", False)
            print(f"rank {me}/{world}: staging {'peer-mapped' if staged else 'plain'}, one-sided copies of a "
                  f"token row or more: {copies[0]}", flush=True)
        for name, ok in checks.items():
            print(f"rank {me}/{world}: {'PASS' if ok else 'FAIL'} {name}")
        every_ok &= all(checks.values())
        print(f"rank {me}/{world}: CONFIG {i} ends {'ok' if all(checks.values()) else 'not ok'}", flush=True)
    raise SystemExit(0 if every_ok else 1)


if __name__ == "__main__":
    main()
