"""python -m bench: `--full` reaches the benchmarks that have a full set, and only those."""
from __future__ import annotations

from bench import __main__ as bench_main
from bench import moe_dispatch, per_task


def test_full_flag_reaches_benchmarks_with_a_full_set(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(moe_dispatch, "run", lambda full=False: calls.append(("moe", full)) or "moe table")
    monkeypatch.setattr(per_task, "run", lambda: calls.append(("per_task",)) or "per-task table")
    assert bench_main.main(["--only", "per_task,moe_dispatch", "--full"]) == 0
    assert bench_main.main(["--only", "moe_dispatch"]) == 0
    assert calls == [("per_task",), ("moe", True), ("moe", False)]
    assert "moe table" in capsys.readouterr().out
