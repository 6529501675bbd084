"""The compiled tier of replays that communicate (replay.tier_segments): runs of torch lines between communication
lines compiled one by one, the communication lines run as recorded, in order.

What users depend on (a serving engine's MoE dispatch and combine every decode step, PYPTO_TIER=eager for warm-up
or background): the compiled calls give the golden's results, with the routing and the token count changing from
call to call (a rank with no tokens among them); the capture call that the segments are built from communicates
exactly as any call (no effect run twice for the check); a segment that fails to compile keeps the whole replay
and says why; PYPTO_STATS shows the segmented tier. Two ranks, forked (tests.collective.harness); the inductor
compiles take seconds each (cached on disk within the session's scratch cache). Inductor is loaded in this process
before the ranks fork (`inductor_loaded`): each rank would otherwise pay its imports and first-compile set-up
(~8 s of CPU); the ranks still compile every graph of theirs.
"""
from __future__ import annotations

import contextlib
import io
import time

import pytest
import torch

from pypto_rt import config
from pypto_rt.replay import tier_inductor, tier_process, tier_segments
from pypto_rt.replay.tier_copies import Held
from pypto_rt.replay.tier_source import Untierable
from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.policy import policy_scope
from tests.collective.harness import run_ranks

H, E_RANK, K, T_MAX = 16, 2, 2, 4
# ranks' token counts: warm-up calls reach each specialisation's tier (recorded, then the capture call), then
# three checked calls change the count and the routing every call; rank 1 has none in two of them
WARM = {0: [3, 3, 1, 1], 1: [0, 0, 2, 2]}
CHECKED = {0: [3, 1, 3], 1: [0, 2, 0]}
# recorded at the first call; keep the replay (no engine trial); the tier trial never ends (the test swaps in)
POLICY = dict(normal_runs=0, trial_replays=0, slower=float("inf"), tier_after_replays=0,
              tier_after_replayed_ms=0, tier_trial_calls=1 << 30)


def _routing(world: int, tokens: int, gen) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    experts = E_RANK * world
    idx = torch.stack([torch.randperm(experts, generator=gen)[:K] for _ in range(tokens)]).to(torch.int32) \
        if tokens else torch.zeros(0, K, dtype=torch.int32)
    return torch.randn(tokens, H, generator=gen), idx, torch.rand(tokens, K, generator=gen)


def _call(buf, me: int, world: int, counts: list, gen) -> bool:
    """One dispatch + combine on every rank (routing drawn for the whole job from one seed), checked on this rank:
    recv.counts and recv.x's rows exact, combine against sum_k w * x * (e + 1)."""
    job = [_routing(world, n, gen) for n in counts]
    x, idx, w = job[me]
    recv = buf.dispatch(x, idx, w)
    every = torch.cat([i for _, i, _ in job]).long().reshape(-1)
    mine = slice(me * E_RANK, (me + 1) * E_RANK)
    ok = torch.equal(recv.counts.long(), torch.bincount(every, minlength=E_RANK * world)[mine])
    for e in range(E_RANK):
        rows = [xr[t] for xr, ir, _ in job for t in range(len(xr)) if (ir[t] == me * E_RANK + e).any()]
        ok &= torch.equal(recv.x[e, :len(rows)], torch.stack(rows)) if rows else True
    scale = (torch.arange(E_RANK) + me * E_RANK + 1).float().view(E_RANK, 1, 1)
    out = buf.combine(recv.x * scale, recv.handle)
    want = x * ((idx.float() + 1) * w).sum(dim=1, keepdim=True)
    return ok and out.shape == (len(x), H) and torch.allclose(out, want, rtol=1e-5, atol=1e-5)


def _tiers(buf) -> list:
    from pypto_rt.kernels.moe.dispatch import combine_kernel, dispatch_kernel
    from pypto_rt.replay.tier import tiers

    return tiers(dispatch_kernel(buf.layout)) + tiers(combine_kernel(buf.layout))


@contextlib.contextmanager
def _moe_buffer(rank):
    """A MoEBuffer of this test's shape on the job's communicator (closed after)."""
    from pypto_rt.collective import process
    from pypto_rt.kernels.moe import MoEBuffer, MoEConfig

    process.install(rank.comm())
    try:
        yield MoEBuffer(MoEConfig(hidden=H, num_experts=E_RANK * rank.world_size, top_k=K, max_tokens_per_rank=T_MAX,
                                  dtype=torch.float32))
    finally:
        process.close()


def _moe_rank(mode: str):
    def rank_fn(rank):
        import os

        from pypto_rt.ops import distributed
        from pypto_rt.replay import tier as tier_module

        os.environ["PYPTO_TIMEOUT_S"] = "240"   # a peer may be compiling (eager) while this rank waits
        notified = []
        notify = distributed._notify_cell

        def counted(*args):   # (the replays record this as the notify's effect)
            notified[-1] += 1
            return notify(*args)
        distributed._notify_cell = counted
        with _moe_buffer(rank) as buf:
            me, world = rank.rank, rank.world_size
            gen = torch.Generator().manual_seed(7)
            results, stats = [], io.StringIO()
            with config.scope(TIER=mode, STATS="1"), policy_scope(**POLICY), contextlib.redirect_stderr(stats):
                for i in range(len(WARM[0])):
                    notified.append(0)
                    results.append(_call(buf, me, world, [WARM[r][i] for r in range(world)], gen))
                assert tier_module.wait_idle(480)   # (cold compiles on a loaded 2-core machine: minutes)
                found = _tiers(buf)
                states = [(t.state, t.text) for t in found]
                for t in found:   # swapped in: every checked call runs the compiled segments
                    t.chosen = t.tiered
                for i in range(len(CHECKED[0])):
                    notified.append(0)
                    results.append(_call(buf, me, world, [CHECKED[r][i] for r in range(world)], gen))
            return results, states, notified, stats.getvalue()
    return rank_fn


@pytest.fixture(scope="module")
def inductor_loaded():
    """One small tier build here (its cache in a folder of its own, in the session's scratch cache), so that forked
    ranks inherit inductor's modules and set-up. Starts no thread or process (compile_threads=1)."""
    import os
    import threading

    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    threads = threading.active_count()   # (earlier tests of the session may have left daemon workers)
    with temporary_cache_dir(os.path.join(os.environ["PYPTO_CACHE_DIR"], "inductor-warm-up")):   # (tests/conftest.py)
        tier_inductor.build(lambda a, b: (a * b + 1.0).relu(), [torch.ones(2, 4), torch.ones(2, 4)], (), 1,
                            lambda graph: None)
    assert threading.active_count() == threads, "the warm-up build left a thread: forking with it is fragile"


@pytest.mark.timeout(720)
@pytest.mark.parametrize("mode", ["eager", "background"])
def test_dispatch_and_combine_run_compiled_segments_and_match_the_golden(inductor_loaded, mode):
    outcome = run_ranks(_moe_rank(mode), 2, deadline_s=660).ok()
    for rank, (results, states, notified, stats) in outcome.items():
        assert all(results), (rank, results)
        # each rank: dispatch and combine at two token counts, each compiled in two segments and in its trial
        assert len(states) == 4 and all(s == "trial" and "2 compiled" in text for s, text in states), states
        # the capture call (the second at each count) notified as often as every other call: nothing ran twice
        assert len(set(notified)) == 1, (rank, notified)
        where = "in a compile process at normal priority" if mode == "eager" else "in the background, in a compile"
        assert f"tier compiling ({where}" in stats and ") · segmented: 2 runs of torch lines" in stats, stats[-2000:]
        assert "tier trial (compiled in" in stats and ", 2 compiled" in stats, stats[-2000:]


def _failing_rank(rank):
    def broken(*args):
        raise RuntimeError("injected: the C++ compiler is missing")
    tier_process.compile_apart = broken   # (a forked rank: its own module; only segments compile in this job)
    with _moe_buffer(rank) as buf:
        gen = torch.Generator().manual_seed(8)
        with config.scope(TIER="eager"), policy_scope(**POLICY):
            results = [_call(buf, rank.rank, rank.world_size, [2, 3], gen) for _ in range(4)]
        return results, [(t.state, t.why, t.chosen is not None) for t in _tiers(buf)]


@pytest.mark.timeout(120)
def test_a_failing_segment_compile_keeps_the_whole_replay_and_says_why(inductor_loaded):
    outcome = run_ranks(_failing_rank, 2, deadline_s=90).ok()
    for rank, (results, tiers) in outcome.items():
        assert all(results), (rank, results)
        assert len(tiers) == 2, tiers
        for state, why, decided in tiers:
            assert state == "failed" and decided, tiers
            assert why.startswith("segment 0 (replay lines ") and "injected" in why, why


SOURCE = """def replay(a0, a1, a2):
    r0 = f0(a2, (1,), (1,), 0).tolist()
    s0 = r0[0]
    v1 = add_1(a0, 1.0)
    v2 = mul_2(v1, k9)
    v3 = add_1(v2, v1)
    del v1
    a1[:, :] = v3
    s1 = a1[0, 0].item()
    comm3(a1, 0, [s1, 0], 'set', s0)
    c0 = s0 + 1
    v4 = add_1(a0, 2.0)
    comm4(a1, [0, 0], 'ge', 'label', c0)
    v5 = mul_2(v3, a1)
    v6 = add_1(v5, v2)
    v7 = add_1(v6, c0)
    del v2, v3, v5
    return (v7, v4)
"""


def test_the_split_keeps_communication_numbers_and_short_runs_as_python_lines_in_order():
    effects = []
    constants = {"f0": torch.as_strided, "add_1": torch.add, "mul_2": torch.mul, "k9": torch.full((2, 2), 3.0),
                 "comm3": lambda *args: effects.append(("notify", args[2][0])),
                 "comm4": lambda *args: effects.append(("wait", args[-1]))}
    split = tier_segments.segmented(SOURCE, constants, "it communicates", min_calls=3)
    assert split.why_not is None
    first, second = split.segments
    assert (first.inputs, first.outputs, first.dropped) == (["a0", "k9", "a1"], ["v2", "v3"], [])
    assert [s.lineno for s in first.statements] == [4, 5, 6, 7, 8]
    # `v4 = ...` (one line between the communication lines) stays replayed in place; the number c0 goes in
    assert (second.inputs, second.outputs, second.dropped) == (["v3", "a1", "v2", "c0"], ["v7"], ["v2", "v3"])
    # the replay with its segments called as functions: the same results and effects, in the same order
    runs = []
    for fn in (compile_trace(SOURCE, constants), split.function({s.index: s.replayed for s in split.segments})):
        a0, a1, a2 = torch.randn(2, 2, generator=torch.Generator().manual_seed(1)), torch.zeros(2, 2), \
            torch.tensor([5])
        effects.clear()
        runs.append((fn(a0, a1, a2), a1.clone(), list(effects)))
    (want, want_a1, want_effects), (got, got_a1, got_effects) = runs
    assert all(torch.equal(w, g) for w, g in zip(want, got)) and torch.equal(want_a1, got_a1)
    assert got_effects == want_effects == [("notify", float(want_a1[0, 0])), ("wait", 6)]
    assert len(tier_segments.segmented(SOURCE, constants, "it communicates", min_calls=4).segments) == 1
    # a communicating replay's runs are not cut by length (a segment given a window's rows: see replay.tier_rows)
    assert len(tier_segments.segmented(SOURCE, constants, "it communicates", 3, max_calls=2).segments) == 2
    assert tier_segments.segmented(SOURCE, constants, None, min_calls=3) is None   # nothing to overrule


def test_a_kernel_block_called_as_it_is_ends_a_run_as_a_communication_line_does():
    """A block whose course follows data (replay.opaque: e.g. a loop bounded by a count the call computed)
    runs in place, once, in order; the torch lines around it are segments, with or without communication."""
    calls = []
    constants = {"f0": torch.as_strided, "add_1": torch.add, "mul_2": torch.mul, "k9": torch.full((2, 2), 3.0),
                 "comm3": lambda *args: calls.append(("notify", args[2][0])),
                 "o5": lambda block, a1, offsets, cmp, label, c0: calls.append(("block", c0))}
    for source in (SOURCE.replace("comm4(a1", "o5(0, a1"),   # and the notify too, with no communication left:
                   SOURCE.replace("comm4(a1", "o5(0, a1").replace("    comm3(a1, 0, [s1, 0], 'set', s0)\n", "")):
        split = tier_segments.segmented(source, constants, "it calls 1 kernel blocks as they are", min_calls=3)
        assert split.why_not is None and [s.inputs for s in split.segments] == [["a0", "k9", "a1"],
                                                                                ["v3", "a1", "v2", "c0"]]
        runs = []
        for fn in (compile_trace(source, constants), split.function({s.index: s.replayed for s in split.segments})):
            a0, a1 = torch.randn(2, 2, generator=torch.Generator().manual_seed(2)), torch.zeros(2, 2)
            calls.clear()
            runs.append((fn(a0, a1, torch.tensor([5])), a1.clone(), list(calls)))
        (want, want_a1, want_calls), (got, got_a1, got_calls) = runs
        assert all(torch.equal(w, g) for w, g in zip(want, got)) and torch.equal(want_a1, got_a1)
        assert got_calls == want_calls and want_calls[-1] == ("block", 6)


def test_a_segment_writing_a_window_stays_replayed(monkeypatch):
    """The compiled graph may write a written input back whole: over a window, that would undo what a peer wrote to
    another part of it meanwhile. A segment whose traced graph writes a window (a1 here) is kept replayed, before
    any compile; one that only reads it is not."""
    from torch.fx.experimental.proxy_tensor import make_fx

    constants = {"f0": torch.as_strided, "add_1": torch.add, "mul_2": torch.mul, "k9": torch.ones(2, 2),
                 "comm3": lambda *args: None, "comm4": lambda *args: None}
    split = tier_segments.segmented(SOURCE, constants, "it communicates", min_calls=3)
    a0, a1, a2 = torch.randn(2, 2), torch.zeros(2, 2), torch.tensor([5])
    monkeypatch.setattr(tier_segments.process, "window_of",
                        lambda t: t.untyped_storage().data_ptr() == a1.untyped_storage().data_ptr())
    snapshots = {}
    split.function({s.index: tier_segments._capture(s, snapshots, 1 << 20, Held()) for s in split.segments})(a0, a1, a2)
    (writes, windows), (reads, read_windows) = snapshots[0], snapshots[1]
    assert windows == read_windows == {"a1"}
    with pytest.raises(Untierable, match="it writes the window a1, which peers write meanwhile"):   # (as _Kept)
        tier_segments._compile(split.segments[0], writes, windows, 1, time.perf_counter() + 600, False)
    first, second = split.segments
    assert tier_segments._written_inputs(make_fx(first.replayed)(*writes)) == {first.inputs.index("a1")}
    assert tier_segments._written_inputs(make_fx(second.replayed)(*reads)) == set()


def test_a_segment_calls_inductors_code_directly_and_falls_back_to_the_wrapped_call_where_that_disagrees(
        monkeypatch):
    """A compiled segment calls inductor's generated `call` itself where AOT kept the traced graph's inputs and
    outputs (replay.tier_graph), as a whole-body tier does: no compile_fx wrappers per call. Its `wrapped` is the
    same through them; the check keeps that one where the direct call disagrees with the replayed segment."""
    from torch._inductor.output_code import CompiledFxGraph

    constants = {"f0": torch.as_strided, "add_1": torch.add, "mul_2": torch.mul, "k9": torch.ones(2, 2),
                 "comm3": lambda *args: None, "comm4": lambda *args: None}
    split = tier_segments.segmented(SOURCE, constants, "it communicates", min_calls=3)
    a0, a1, a2 = torch.randn(2, 2), torch.zeros(2, 2), torch.tensor([5])
    monkeypatch.setattr(tier_segments.process, "window_of", lambda t: False)
    snapshots = {}
    split.function({s.index: tier_segments._capture(s, snapshots, 1 << 20, Held()) for s in split.segments})(a0, a1, a2)
    segment = split.segments[1]   # (v3, a1, v2, c0) -> v7: an integer among its inputs
    compiled = tier_segments._compile(segment, *snapshots[1], 1, time.perf_counter() + 600, False)
    assert compiled.wrapped is not None
    checked, problem = tier_segments._checked(segment, compiled, snapshots[1][0])
    assert checked is compiled and problem is None
    wrappers = []
    real = CompiledFxGraph.__call__
    monkeypatch.setattr(CompiledFxGraph, "__call__", lambda *a, **k: wrappers.append(1) or real(*a, **k))
    inputs = list(snapshots[1][0])
    want = segment.replayed(*inputs)
    got = compiled(*inputs)
    assert torch.allclose(got[0], want[0]) and wrappers == []   # nothing of compile_fx's wrappers ran
    compiled.wrapped(*inputs)
    assert wrappers, "the wrapped call goes through the compiled graph's __call__ (what the direct call skips)"

    def wrong(*inputs):
        return tuple(t + 1 for t in segment.replayed(*inputs))
    wrong.wrapped = compiled.wrapped
    checked, problem = tier_segments._checked(segment, wrong, snapshots[1][0])
    assert checked is compiled.wrapped and problem is None
