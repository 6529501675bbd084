"""The one-block summary of a run that PYPTO_STATS=1 prints to stderr. Imports nothing from pypto_rt.

The stats dict (Engine.stats, filled by finish) has: tasks, dummy_tasks, edges {RAW, WAW, WAR, explicit,
atomic_order (printed when there are any)}, ring_high_water, ring_size, workers, and the times orchestration_ns
(construction to finish(): the host program submitting), kernel_ns (sum of block run times), idle_while_ready_ns
(worker lanes idle while a block of theirs was queued), wall_ns (construction to the end of finish()), and
host_reads (elements of tensor data the host program read: `pl.read` or `x[i, j]` outside InCore regions).
"""
from __future__ import annotations


def format_stats(run: str, stats: dict) -> str:
    edges = stats["edges"]

    def ms(key: str) -> str:
        return f"{stats[key] / 1e6:.2f} ms"

    return (f"pypto-rt stats [{run}]: {_count(stats['tasks'], 'task')} ({stats['dummy_tasks']} dummy)"
            f" · {_count(sum(edges.values()), 'edge')} (RAW {edges['RAW']}, WAW {edges['WAW']}, WAR {edges['WAR']},"
            f" explicit {edges['explicit']}"
            + (f", atomic order {edges['atomic_order']}" if edges.get("atomic_order") else "") + ")"
            f" · ring high-water {stats['ring_high_water']}/{stats['ring_size']}"
            f" · orchestration {ms('orchestration_ns')}"
            f" · kernels {ms('kernel_ns')} on {_count(stats['workers'], 'worker')}"
            f" · worker idle while work was ready {ms('idle_while_ready_ns')}"
            f" · host reads {stats.get('host_reads', 0)}"
            f" · wall {ms('wall_ns')}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
