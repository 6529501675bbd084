"""Chrome trace-event JSON (loads in Perfetto) and a Graphviz dump of one run's task graph.

Lanes: tid 0..workers-1 are the worker lanes ("worker i"), tid `workers` is the orchestrator, which gets one
instant event per submit. Every block that ran is one "X" slice. Times are µs since the run started.
Imports nothing from pypto_rt.
"""
from __future__ import annotations

import json

from .task import Task


def graph_path(trace_path: str) -> str:
    """`<trace_path minus .json>.graph.dot`."""
    base = trace_path[:-5] if trace_path.endswith(".json") else trace_path
    return base + ".graph.dot"


def write_trace(path: str, run: str, tasks: list[Task], workers: int, t0_ns: int) -> None:
    """Write the trace to `path` and the dependency graph next to it."""
    def us(ns: int) -> float:
        return (ns - t0_ns) / 1000

    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"pypto-rt {run}"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": lane, "args": {"name": f"worker {lane}"}}
               for lane in range(workers)]
    events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": workers, "args": {"name": "orchestrator"}})
    for task in tasks:
        events.append({"name": f"submit {task.name}", "ph": "i", "s": "t", "pid": 1, "tid": workers,
                       "ts": us(task.t_submit), "args": {"task": task.id}})
        deps = [p.id for p, _ in task.deps]
        for block, lane, start, end in task.slices:
            args = {"task": task.id, "block": block, "submit_us": us(task.t_submit), "ready_us": us(task.t_ready),
                    "deps": deps}
            if task.error is not None:
                args["error"] = repr(task.error)
            events.append({"name": task.name, "ph": "X", "pid": 1, "tid": lane, "ts": us(start),
                           "dur": (end - start) / 1000, "args": args})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    with open(graph_path(path), "w") as f:
        f.write(dependency_graph(run, tasks))


def dependency_graph(run: str, tasks: list[Task]) -> str:
    """Graphviz text: one node per task (name#id), one edge per wired dependency labelled RAW/WAW/WAR/dep."""
    lines = [f"digraph {json.dumps(run)} {{", "  node [shape=box];"]
    for task in tasks:
        style = ", style=dashed" if task.run is None else ""
        lines.append(f"  t{task.id} [label={json.dumps(f'{task.name}#{task.id}')}{style}];")
    for task in tasks:
        lines += [f"  t{p.id} -> t{task.id} [label=\"{kind}\"];" for p, kind in task.deps]
    lines.append("}")
    return "\n".join(lines) + "\n"
