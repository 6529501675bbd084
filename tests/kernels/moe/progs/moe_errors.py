"""MoEBuffer's user errors in a launched job: raised before any communication, so the job goes on.

    pypto-launch --nproc 2 moe_errors.py recover     # every rank makes each mistake, then a good call
    pypto-launch --nproc 2 moe_errors.py uncaught    # rank 0 passes too many tokens (the job must fail)
    pypto-launch --nproc 2 moe_errors.py absent      # rank 1 never dispatches (rank 0's wait must time out)
    pypto-launch --nproc 3 moe_errors.py world       # 3 ranks do not divide 4 experts

`recover` prints `CAUGHT <case>: <message>` per mistake and `PASS`/`FAIL` for the good call afterwards, and
checks that no mistake touched the buffer's signals (nothing was sent).
"""
import sys
import time

import torch

import pypto.language.distributed as pld
from pypto_rt.kernels.moe import MoEArgumentError, MoEBuffer, MoEConfig, MoEConfigError

H, E_PER_RANK, K, T_MAX = 16, 2, 2, 4


def config(world: int) -> MoEConfig:
    return MoEConfig(hidden=H, num_experts=E_PER_RANK * world, top_k=K, max_tokens_per_rank=T_MAX,
                     dtype=torch.bfloat16)


def good_inputs(world: int, tokens: int = 3):
    x = torch.randn(tokens, H).bfloat16()
    idx = torch.stack([torch.randperm(E_PER_RANK * world)[:K] for _ in range(tokens)]).to(torch.int32)
    return x, idx, torch.rand(tokens, K)


def mistakes(buf: MoEBuffer, world: int):
    x, idx, w = good_inputs(world)
    bad_idx = idx.clone()
    bad_idx[1, 0] = E_PER_RANK * world
    twice = idx.clone()
    twice[2, 1] = twice[2, 0]
    yield "tokens", lambda: buf.dispatch(torch.randn(T_MAX + 1, H).bfloat16(), *good_inputs(world, T_MAX + 1)[1:])
    yield "expert_range", lambda: buf.dispatch(x, bad_idx, w)
    yield "duplicate_expert", lambda: buf.dispatch(x, twice, w)
    yield "dtype", lambda: buf.dispatch(x.float(), idx, w)
    yield "hidden", lambda: buf.dispatch(torch.randn(3, H + 1).bfloat16(), idx, w)
    yield "weights_shape", lambda: buf.dispatch(x, idx, w[:, :1])
    yield "combine_without_dispatch", lambda: buf.combine(torch.zeros(1), None)


def recover():
    me, world = pld.rank(), pld.world_size()
    buf = MoEBuffer(config(world))
    for case, call in mistakes(buf, world):
        try:
            call()
            print(f"rank {me}: FAIL {case}: no error")
        except MoEArgumentError as e:
            print(f"rank {me}: CAUGHT {case}: {e.message}")
    untouched = buf.transport.signals_untouched()
    print(f"rank {me}: {'PASS' if untouched else 'FAIL'} nothing was sent")
    torch.manual_seed(11)   # the same routing on every rank: any rank can check the counts
    x, idx, w = good_inputs(world)
    recv = buf.dispatch(x, idx, w)
    try:
        buf.dispatch(x, idx, w)
        print(f"rank {me}: FAIL dispatch twice: no error")
    except MoEArgumentError as e:
        print(f"rank {me}: CAUGHT dispatch_twice: {e.message}")
    stale = recv.handle
    out = buf.combine(recv.x, recv.handle)
    try:
        buf.combine(recv.x, stale)
        print(f"rank {me}: FAIL combine twice: no error")
    except MoEArgumentError as e:
        print(f"rank {me}: CAUGHT combine_twice: {e.message}")
    want = x.float() * w.sum(dim=1, keepdim=True)
    ok = torch.allclose(out.float(), want, rtol=3e-2, atol=3e-2)
    print(f"rank {me}: {'PASS' if ok else 'FAIL'} the call after the mistakes")
    raise SystemExit(0 if ok and untouched else 1)


def uncaught():
    me, world = pld.rank(), pld.world_size()
    buf = MoEBuffer(config(world))
    tokens = T_MAX + 1 if me == 0 else 2
    x, idx, w = good_inputs(world, tokens)
    buf.dispatch(x, idx, w)


def absent():
    me, world = pld.rank(), pld.world_size()
    buf = MoEBuffer(config(world))
    if me == 1:
        time.sleep(120)   # never dispatches; the launcher ends it when rank 0 fails
    buf.dispatch(*good_inputs(world))


def world_size():
    try:
        MoEBuffer(MoEConfig(hidden=H, num_experts=4, top_k=K, max_tokens_per_rank=T_MAX))
    except MoEConfigError as e:
        print(f"rank {pld.rank()}: CAUGHT world: {e.message}")
        raise SystemExit(0)
    raise SystemExit(1)


if __name__ == "__main__":
    {"recover": recover, "uncaught": uncaught, "absent": absent, "world": world_size}[sys.argv[1]]()
