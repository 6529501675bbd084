"""Families of sizes in the compiled tier (replay.tier_family): specialisations of one entry whose replays differ only
in integers that follow the arguments' sizes share one graph compiled with dynamic sizes.

What users depend on: an entry called at several sizes (serving batch buckets) is compiled twice (the first size's
own graph, then one graph of dynamic sizes) and no more, every size's results are right, a size whose call
structure differs (a tile loop whose trip count follows the size) compiles its own graph and says why, and the
replay's guards still send a call taking another course to the engine. Compiles take seconds here.
"""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
from pypto_rt import config, run_stats
from pypto_rt.replay import tier_family, tier_process
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import TRIAL, tiers
from pypto_rt.run_stats import GUARD_MISS, REPLAYED

COLS, TILE = 16, 4
N = pl.dynamic("N")
WARM = 8   # calls that reach a steady replay and a compiled one in its trial
# keep the replay (no engine trial); keep trying both tiers (the tier trial never ends)
KEEP = dict(slower=float("inf"), trial_replays=0, tier_trial_calls=1 << 30, tier_after_replays=0,
            tier_after_replayed_ms=0)


@pl.jit
def pair_sums(x: pl.Tensor[[N, COLS], pl.FP32], flag: pl.Tensor[[1], pl.INT32],
              y: pl.Out[pl.Tensor[[N, COLS], pl.FP32]]):
    on = pl.read(flag, [0])   # a guard: the branch taken
    if on > 0:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="pairs"):   # (reshapes record the row count as integers)
            pairs = pl.reshape(pl.mul(x, x), [x.shape[0] * 2, COLS // 2])
            sums = pl.reshape(pl.row_sum(pairs), [x.shape[0], 2])
            y[:, :] = pl.add(x, sums[:, 0:1])
    else:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="down"):
            y[:, :] = pl.sub(x, 1.0)
    return y


def want_pair_sums(x, on):
    return x + (x * x).reshape(-1, 2, COLS // 2).sum(-1)[:, 0:1] if on else x - 1.0


@pytest.fixture
def builds(monkeypatch):
    """The builds the tier sent to its compile process (one per graph built), by the dynamic dims they asked for."""
    made, build = [], tier_process.build

    def counting(request, *args, **kwargs):
        made.append(request["dynamic"])
        return build(request, *args, **kwargs)
    monkeypatch.setattr(tier_process, "build", counting)
    return made


def call_sizes(kernel, want, sizes, tier="eager", **extra):
    with config.scope(TIER=tier), policy_scope(**KEEP):
        for rows in sizes:
            for _ in range(WARM):
                x, y = torch.randn(rows, COLS), torch.empty(rows, COLS)
                kernel(x, *extra.values(), y)
                torch.testing.assert_close(y, want(x), msg=lambda m: f"{rows} rows: {m}")


def test_sizes_whose_integers_follow_the_row_count_share_one_graph_of_dynamic_sizes(builds):
    on = torch.tensor([1], dtype=torch.int32)
    call_sizes(pair_sums, lambda x: want_pair_sums(x, 1), (4, 8, 12, 16), flag=on)
    found = tiers(pair_sums)
    assert len(found) == 4 and all(t.state == TRIAL and t.tiered is not None for t in found), [t.text for t in found]
    assert len(builds) == 2, builds   # the first size's own graph, then one of dynamic sizes: rows 12 and 16 share it
    assert builds[1] == {0: {0}, 2: {0}}, builds   # x's and y's rows
    assert "one graph with dynamic sizes for 2 sizes" in found[1].text, found[1].text
    for t in found[2:]:
        assert "shares its family's graph of dynamic sizes" in t.text and t.trial_ns[0], t.text
    # a guard miss at a shared size: the engine runs the call, the flag is read again
    x = torch.randn(12, COLS)
    found[2].chosen = found[2].tiered   # (swapped in: every call of 12 rows runs it)
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for flag in (1, 0, 1):
            y = torch.empty(12, COLS)
            with run_stats.collect() as stats:
                pair_sums(x, torch.tensor([flag], dtype=torch.int32), y)
            torch.testing.assert_close(y, want_pair_sums(x, flag))
            assert stats.replay.kind == (REPLAYED if flag else GUARD_MISS), stats.replay


def test_a_size_whose_tile_loop_differs_is_size_specialised_and_says_why():
    @pl.jit
    def running_sum(x: pl.Tensor[[N, COLS], pl.FP32], y: pl.Out[pl.Tensor[[N, COLS], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
            acc = x[0:TILE, :]
            for i in pl.range(x.shape[0] // TILE):   # one add per tile, each on the last: the structure follows N
                acc = pl.add(acc, x[i * TILE:(i + 1) * TILE, :])
                y[i * TILE:(i + 1) * TILE, :] = acc
        return y

    def want(x):
        tiles = x.reshape(-1, TILE, COLS)
        return (tiles.cumsum(0) + tiles[0]).reshape(-1, COLS)

    # (recorded only: the tier's build would compile each size's own graph)
    call_sizes(running_sum, want, (TILE, 2 * TILE, 3 * TILE), tier="off")
    families = tier_family.Families()
    joined = [tier_family.join(families, t.source, t.constants, [torch.empty(r, COLS), torch.empty(r, COLS)])
              for t, r in zip(tiers(running_sum), (TILE, 2 * TILE, 3 * TILE))]
    assert [kind for _, kind, _ in joined] == [tier_family.OWN] * 3
    assert joined[2][2] == "size-specialised: its call structure differs from 2 other recorded size(s)'", joined


class _Member(tier_family.Member):
    def __init__(self, ints, dims):
        super().__init__(tuple(ints), tuple(dims), {})


def test_each_differing_integer_is_fitted_to_the_simplest_size_it_follows():
    # sizes (rows, heads*rows): integers rows, 2*rows, rows+1, heads*rows, and one that follows no size
    members = [_Member([r, 2 * r, r + 1, 4 * r, 7], [r, 4 * r, 16]) for r in (2, 5)]
    fitted, why = tier_family.fit(members)
    assert fitted == {0: (0, 1, 0), 1: (0, 2, 0), 2: (0, 1, 1), 3: (1, 1, 0)}, fitted
    odd = members + [_Member([9, 18, 10, 36, 3], [9, 36, 16])]   # the last integer differs, no size explains it
    assert tier_family.fit(odd) == (None, "a recorded integer (7, 7, 3) follows no argument size ((2, 8), (5, 20), "
                                          "(9, 36))")


def test_a_later_size_whose_integers_leave_the_fit_is_not_shared():
    family = tier_family.Family(((0, 0),), ("a0",), [_Member([1, 1], [1]), _Member([2, 2], [2])])
    family.fit, _ = tier_family.fit(family.members)
    assert family.fits(_Member([8, 8], [8]))
    assert not family.fits(_Member([8, 2], [8]))   # min(rows, 2): fitted as rows on 1 and 2, not at 8


def test_a_body_rewritten_for_its_family_computes_each_size_as_its_own_replay():
    from pypto_rt.replay.passes import compile_trace
    from pypto_rt.replay.tier_source import split_source

    def recorded(rows):   # a replay as the recorder writes it: a row count as a literal and in a shape constant
        source = (f"def replay(a0, a1):\n    v2 = view_0(a0, [{2 * rows}, 8])\n    v3 = sum_1(v2, dim=-1)\n"
                  f"    a1[0:{rows}, :] = reshape_2(v3, k1)\n    return (a1,)\n")
        return source, {"view_0": torch.Tensor.view, "sum_1": torch.sum, "reshape_2": torch.reshape,
                        "k1": torch.Size([rows, 2])}

    families = tier_family.Families()
    for rows, kind in ((2, tier_family.OWN), (3, tier_family.GENERIC), (5, tier_family.SHARE)):
        source, constants = recorded(rows)
        args = [torch.randn(rows, COLS), torch.zeros(rows, 2)]
        family, got, why = tier_family.join(families, source, constants, args)
        assert (got, why) == (kind, ""), (rows, got, why)
        if kind == tier_family.GENERIC:
            family.shared = object()   # (as the tier does once the graph of dynamic sizes is verified)
    generic = split_source(source, constants, args, rewrite=family.rewrite)[1]
    for rows in (4, 7):   # the rewritten body at sizes it was not recorded at: each size's own replay
        own, own_constants = recorded(rows)
        x = torch.randn(rows, COLS)
        want, got = torch.zeros(rows, 2), torch.zeros(rows, 2)
        compile_trace(own, own_constants, "<replay>")(x, want)
        generic(x, got)
        assert torch.equal(got, want)


@pl.jit
def doubled(x: pl.Tensor[[N, COLS], pl.FP32], y: pl.Out[pl.Tensor[[N, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="doubled"):
        y[:, :] = pl.add(pl.mul(x, 2.0), 1.0)
    return y


def test_arguments_that_are_views_into_larger_memory_share_one_graph_of_dynamic_sizes(builds):
    """What serving engines pass: the first rows of a persistent buffer, a slice of a pool (strided, at an offset,
    both in one memory here). Each size's compiled call agrees with its replay (the trial's check), and the
    memory around the views is untouched."""
    pool = torch.zeros(64, 2 * COLS)
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for rows in (4, 8, 12):
            for _ in range(WARM):
                x, y = pool[3:3 + rows, :COLS], pool[40:40 + rows, COLS:]
                x.normal_()
                want = x * 2 + 1
                doubled(x, y)
                torch.testing.assert_close(y, want, msg=lambda m: f"{rows} rows: {m}")
                assert not pool[:40, COLS:].any() and not pool[40 + rows:, COLS:].any(), rows
                pool[40:40 + rows, COLS:] = 0
    found = tiers(doubled)
    assert len(found) == 3 and all(t.state == TRIAL and t.tiered is not None for t in found), [t.text for t in found]
    assert len(builds) == 2, builds
    assert "one graph with dynamic sizes for 2 sizes" in found[1].text, found[1].text
    assert "shares its family's graph of dynamic sizes" in found[2].text and found[2].trial_ns[0], found[2].text
