"""Benchmark 13's table (bench/serving_throughput.py) from the flagship's --json figures: one row per rank count,
tokens/s against 1 rank, and the loop's time split into forward (MoE layers of it), all-reduce and host."""
from bench import serving_throughput


def test_one_row_per_rank_count_with_the_speed_up_and_the_time_split(monkeypatch):
    def figures(nproc, requests):
        return dict(output_tokens_per_s=10.0 * nproc, steps=50, batch_mean=2.0, tpot_p50_s=0.5, ttft_p50_s=1.0,
                    model_share=0.7, moe_share=0.4, agree_share=0.2, passed=True)
    monkeypatch.setattr(serving_throughput, "serve_once", figures)
    lines = serving_throughput.run().splitlines()
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2", "| 4"]
    assert "| 40.0 | 4.00x |" in rows[2] and "| 70% | 40% | 20% | 10% | PASS |" in rows[2]
