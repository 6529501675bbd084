"""Trace (Chrome JSON + Graphviz) and the stats line."""
from __future__ import annotations

import json
import time

import torch

from pypto_rt.aicpu import TaskAccess, Engine, region_of


def _small_run(**kwargs) -> Engine:
    x = torch.zeros(4, 4)
    with Engine(num_workers=2, name="demo", **kwargs) as e:
        for i in range(4):
            e.submit(f"row{i}", lambda b: time.sleep(0.05), [TaskAccess(region_of(x, (i, None), (1, None)), "w")])
        e.submit("all", lambda b: None, [TaskAccess(region_of(x), "r")])
        e.submit("spmd", lambda b: None, blocks=3)
        e.finish()
    return e


def test_trace_has_a_slice_per_block_and_a_graph(tmp_path):
    path = tmp_path / "run.json"
    _small_run(trace_path=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    slices = [ev for ev in events if ev["ph"] == "X"]
    assert sorted(ev["name"] for ev in slices) == ["all", "row0", "row1", "row2", "row3"] + ["spmd"] * 3
    assert {ev["args"]["block"] for ev in slices if ev["name"] == "spmd"} == {0, 1, 2}
    assert sum(ev["ph"] == "i" for ev in events) == 6
    lanes = {ev["args"]["name"] for ev in events if ev["name"] == "thread_name"}
    assert lanes == {"worker 0", "worker 1", "orchestrator"}
    graph = (tmp_path / "run.graph.dot").read_text()
    assert graph.startswith("digraph") and graph.count('[label="RAW"]') == 4 and 'label="all#4"' in graph


def test_stats_are_filled_and_printed(capsys):
    e = _small_run(stats=True)
    err = capsys.readouterr().err
    assert err.startswith("pypto-rt stats [demo]: 6 tasks (0 dummy) · 4 edges (RAW 4, WAW 0, WAR 0, explicit 0)")
    assert "on 2 workers" in err and "ring high-water" in err
    assert e.stats["kernel_ns"] > 0 and e.stats["wall_ns"] >= e.stats["orchestration_ns"]


def test_stats_stay_quiet_by_default(capsys):
    _small_run(stats=False)
    assert capsys.readouterr().err == ""
