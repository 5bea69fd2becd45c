"""Smoke test of `ddtree bench core` on a tiny CPU shape (one repeat)."""

from __future__ import annotations

import argparse
import json

from ddtree.bench import core


def test_bench_core_tiny_cpu(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    core.add_arguments(parser)
    out = tmp_path / "core.json"
    args = parser.parse_args([
        "--device", "cpu", "--vocab", "50", "--depth", "3", "--batch-sizes", "1,2", "--budgets", "4,9",
        "--repeats", "1", "--warmup", "0", "--check", "--threads", "1", "--json-out", str(out),
    ])
    assert core.run(args) == 0
    printed = capsys.readouterr().out
    assert "heap/batched" in printed and "sampling ms" in printed
    data = json.loads(out.read_text())
    assert data["setup"]["device"] == "cpu"
    rows = data["rows"]
    assert [(r["batch"], r["budget"]) for r in rows] == [(1, 4), (1, 9), (2, 4), (2, 9)]
    for r in rows:
        assert r["agree"] is True
        assert r["heap_ms"] > 0 and r["batched_ms"] > 0 and r["auto_ms"] > 0
        assert abs(r["heap_over_batched"] - r["heap_ms"] / r["batched_ms"]) < 1e-9
        if data["setup"]["verify"] == "ok":
            assert r["greedy_ms"] > 0 and r["sampling_ms"] > 0


def test_table_marks_missing_columns() -> None:
    table = core.format_table([{"batch": 1, "budget": 4, "heap_ms": 1.0, "batched_ms": 0.5}])
    assert "n/a" in table.splitlines()[2]
