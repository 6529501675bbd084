"""Benchmark 17 runs: both kernels reach their replay before timing, and the table has a row for each."""
from __future__ import annotations

from bench import replay_entry


def test_the_fixed_cost_table_has_a_row_per_kernel():
    table = replay_entry.run(repeats=2)
    rows = [line for line in table.splitlines() if line.startswith("| 2 |") or line.startswith("| 16 |")]
    assert len(rows) == 2 and all(" µs" in row for row in rows), table
