"""bench.moe_dispatch and bench.moe_rank: the harness around both contenders.

MoEBuffer's side is exercised with a stand-in that has its API (built on the gloo baseline), so the harness's
checks, counters and table are tested before and independently of the real buffer.
"""
from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from bench import moe_dispatch, moe_rank
from bench.moe_baseline import GlooDispatch
from bench.moe_routing import CHECK
from pypto_rt.kernels.moe import MoEConfig
from tests.collective.harness import run_ranks


class StandInBuffer:
    """MoEBuffer's API over the gloo baseline: recv.x [E_l, world*T_MAX, H] packed per local expert from row 0."""

    def __init__(self, cfg, bug: str = ""):
        self.world = dist.get_world_size()
        self.cfg, self.bug = cfg, bug
        self.base = GlooDispatch(cfg.num_experts // self.world)
        self.sent = 0

    def dispatch(self, x, topk_idx, topk_weights):
        recv = self.base.dispatch(x, topk_idx, topk_weights)
        experts = self.cfg.num_experts // self.world
        counts = torch.bincount(recv.local_expert, minlength=experts)
        order = torch.argsort(recv.local_expert, stable=True)
        expert = recv.local_expert[order]
        slot = torch.arange(len(order)) - (torch.cumsum(counts, 0) - counts)[expert]
        packed = torch.zeros(experts, self.world * self.cfg.max_tokens_per_rank, x.shape[1], dtype=x.dtype)
        packed[expert, slot] = recv.x[order]
        self.sent += 2 * topk_idx.numel() * x.shape[1] * x.element_size() + 8 * self.cfg.num_experts
        if self.bug == "counts":
            counts = counts.flip(0)
        return SimpleNamespace(x=packed, counts=counts.int(), handle=(recv.handle, order, expert, slot))

    def combine(self, y, handle):
        inner, order, expert, slot = handle
        rows = torch.empty(len(order), y.shape[2], dtype=y.dtype)
        rows[order] = y[expert, slot]
        out = self.base.combine(rows, inner)
        return out * 2 if self.bug == "combine" else out

    def stats(self) -> dict:
        return {"bytes_sent": self.sent, "host_reads": self.base.host_reads, "replayed": False}


def _gloo(ctx) -> None:
    dist.init_process_group("gloo", store=dist.PrefixStore("bench/", ctx.store), rank=ctx.rank,
                            world_size=ctx.world_size, timeout=datetime.timedelta(seconds=20))


def _measure(ctx, bug: str = "") -> list[dict]:
    _gloo(ctx)
    try:
        ours = (lambda cfg: StandInBuffer(cfg, bug), MoEConfig)
        return [moe_rank.measure_shape(shape, 3, 1, ours) for shape in CHECK]
    finally:
        dist.destroy_process_group()


def test_ours_side_is_checked_timed_and_counted():
    ranks = run_ranks(_measure, 2, deadline_s=60).ok()
    rows = [ranks[0], ranks[1]]
    for row in rows[0]:
        assert row["ours"]["status"] == "ok" and len(row["ours"]["samples"]) == len(row["baseline"]["samples"]) == 3
        assert row["ours"]["stats_after"]["host_reads"] > row["ours"]["stats_before"]["host_reads"]
    text = moe_dispatch.report({2: rows})
    lines = [line for line in text.splitlines() if line.startswith("| 2 |")]
    assert len(lines) == 2 * len(CHECK)
    # the stand-in sends a row per selected pair and reads the splits twice per call, as the baseline does
    for shape, line in zip(CHECK, lines[len(CHECK):]):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[5] == f"{cells[4]} (stats())" and (cells[6], cells[7]) == ("2", "2 (stats())"), cells
        recv_x = 8 * 2 * shape.tokens * shape.row_bytes()     # [E_l, world * T_MAX, H]
        assert cells[9] == moe_dispatch._mib(recv_x) and cells[10] == "- / -", cells   # no pypto kernels inside


def test_ours_wire_falls_back_to_sent_rows():
    shape = {"phase": "decode", "tokens": 4, "hidden": 8, "top_k": 2, "skewed": False}
    rows = [{"shape": shape, "calls": 3, "ours": {"stats_after": None, "sent_rows": [1, 2]}},
            {"shape": shape, "calls": 3, "ours": {"stats_after": None, "sent_rows": [4, 0]}}]
    assert moe_dispatch.ours_wire(rows) == (2 * 7 * 8 * 2, "payload rows, sent_rows()")
    rows[1]["ours"]["sent_rows"] = None
    assert moe_dispatch.ours_wire(rows) is None


@pytest.mark.parametrize("bug", ["counts", "combine"])
def test_a_wrong_buffer_fails_its_check_naming_rank_and_shape(bug):
    errors = run_ranks(lambda ctx: _measure(ctx, bug), 2, deadline_s=60).errors
    assert errors and all(e["type"] == "ContenderMismatch" for e in errors.values()), errors
    text = errors[min(errors)]["text"]
    assert f"rank {min(errors)}: MoEBuffer" in text and "MoEShape(phase='decode'" in text


def _absent(ctx):
    _gloo(ctx)
    try:
        return moe_rank.measure_shape(CHECK[0], 2, 1, None)
    finally:
        dist.destroy_process_group()


def test_without_moe_buffer_the_rows_say_not_built_yet():
    rows = list(run_ranks(_absent, 2, deadline_s=60).ok().values())
    text = moe_dispatch.report({2: [[rows[0]], [rows[1]]]})
    assert text.count(moe_rank.NOT_BUILT) == 1     # in the timing row; the bytes row has "-" for MoEBuffer


def test_latency_is_the_slowest_rank_per_call():
    rows = [{"baseline": {"samples": [1.0, 5.0, 2.0]}}, {"baseline": {"samples": [3.0, 1.0, 2.0]}}]
    median, p90 = moe_dispatch.latency(rows, "baseline")
    assert median == 3.0 and p90 >= 3.0     # per call: 3, 5, 2


def test_consecutive_calls_give_a_second_speed_up_and_verdict():
    shape = {"phase": "decode", "tokens": 8, "hidden": 64, "top_k": 2, "skewed": False}

    def row(base_runs, ours_runs):
        return {"shape": shape, "bytes": {"logical": 1e6},
                "baseline": {"samples": [4e-3] * 3, "consecutive": base_runs},
                "ours": {"status": "ok", "samples": [3e-3] * 3, "consecutive": ours_runs}}

    # per run the slowest rank: baseline 5, 6 ms, ours 2, 3 ms -> medians 5.5 against 2.5 ms
    cells = moe_dispatch._timing_row([row([5e-3, 6e-3], [2e-3, 1e-3]), row([4e-3, 5e-3], [1e-3, 3e-3])], 2)
    assert cells[8] == "1.33x" and cells[9].endswith("misses"), cells          # barrier before each call: 4 / 3 ms
    assert cells[11] == "5.50 ms / 2.50 ms: 2.20x" and cells[12].endswith("meets"), cells
    assert moe_dispatch._timing_row([row([], [])], 2)[10:] == ["-", "-", "-"]   # no spans, no consecutive runs


def test_the_span_from_the_last_entry_leaves_the_barriers_stagger_out():
    """Per call: the latest exit minus the latest entry over the ranks (one clock), so a rank that left the barrier
    early and waited in the call for a late one adds nothing; the median over calls."""
    rows = [{"baseline": {"spans": [(0.0, 5.0), (10.0, 12.0), (20.0, 30.0)]}},    # rank 0 entered first each time
            {"baseline": {"spans": [(3.0, 5.5), (10.5, 12.0), (29.0, 30.5)]}}]
    assert moe_dispatch.from_last_entry(rows, "baseline") == 1.5      # per call: 2.5, 1.5, 1.5
    assert moe_dispatch.latency([{"baseline": {"samples": [e - s for s, e in r["baseline"]["spans"]]}}
                                 for r in rows], "baseline")[0] == 5.0  # the slowest rank's own time: 5, 2, 10
    assert moe_dispatch.from_last_entry([{"baseline": {}}], "baseline") is None


def test_launched_job_runs_the_baseline_alone_when_asked():
    ranks = moe_dispatch.run_world(2, "check", iters=2, warmup=1, baseline_only=True)
    assert [[row["rank"] for row in rows] for rows in ranks] == [[0] * len(CHECK), [1] * len(CHECK)]
    assert all(len(row["baseline"]["samples"]) == 2 for rows in ranks for row in rows)
    text = moe_dispatch.report({2: ranks})
    assert text.count("not run (--baseline-only)") == len(CHECK)


def test_ours_host_reads_from_run_stats_on_the_busiest_rank():
    def row(dispatch_reads, combine_reads):
        calls = {"dispatch": {"kind": "engine", "reason": "", "host_reads": dispatch_reads},
                 "combine": {"kind": "engine", "reason": "", "host_reads": combine_reads}}
        return {"calls": 3, "ours": {"stats_after": None, "replay": calls}}

    assert moe_dispatch._ours_reads([row(0, 0), row(2, 1)]) == "3 (host program)"
    assert moe_dispatch._ours_reads([row(0, 0), row(None, None)]) == "n/a (no counter)"   # runtime without it


def test_tier_eager_rows_give_compiled_against_replayed_and_build_times():
    shape = {"phase": "decode", "tokens": 8, "hidden": 64, "top_k": 2, "skewed": False}

    def row(compiled, replayed, build_s):
        tiers = [{"entry": "dispatch_kernel", "state": "trial", "compile_s": build_s, "text": ""}]
        return {"shape": shape, "baseline": {"samples": [4.0, 4.0, 4.0]},
                "ours": {"samples": compiled, "replayed_samples": replayed, "tiers": tiers}}

    cells = moe_dispatch._tier_row([row([1.0, 1.0, 1.0], [3.0, 3.0, 3.0], 2.0),
                                    row([2.0, 1.0, 2.0], [2.0, 3.0, 2.0], 4.5)], 2)
    # per call the slowest rank: compiled 2, 1, 2 s; replayed 3, 3, 3 s
    assert cells[3].startswith("2000.0 ms") and cells[4].startswith("3000.0 ms"), cells
    assert (cells[5], cells[6]) == ("1.50x", "2.00x"), cells
    assert cells[7] == "dispatch_kernel: trial 2.0 s, trial 4.5 s", cells
    assert moe_dispatch._tier_row([{**row([1.0], [1.0], 1.0), "ours": {"samples": [1.0]}}], 2) is None
