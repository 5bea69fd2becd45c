"""`ddtree bench throughput` against the real reference server on the tiny pair."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree.bench.records import record_key
from ddtree.bench.schema import ThroughputRecord, read_record_file
from ddtree.bench.session import ServerProcess
from ddtree.bench.throughput import RECORD_FIELDS, run_throughput, summarize_level
from ddtree.cli import main as ddtree_main

TAGS = {"pair": "tiny", "method": "dflash"}
KEYS = [*TAGS, "concurrency", "request_index"]
EPS = 1e-3  # seconds of clock slack between client-side timestamps


@pytest.fixture(scope="module")
def server(tiny_pair: Path, tmp_path_factory, reference_server) -> Iterator[ServerProcess]:
    with reference_server(tiny_pair, "dflash", tmp_path_factory.mktemp("thr_server") / "server.log") as srv:
        yield srv


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def max_overlap(records: list[dict]) -> int:
    """Most requests in flight at once, from their client-side start/end times."""
    events = sorted([(r["start_time"], 1) for r in records] + [(r["end_time"] - EPS, -1) for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def sweep(server: ServerProcess, prompts: Path, out: Path) -> dict:
    return run_throughput(server.url, prompts, concurrency=[1, 3], num_requests=4, max_new_tokens=6,
                          variant={"name": "greedy", "temperature": 0.0, "ignore_eos": True}, tags=TAGS, out=out)


def test_sweep_records_summary_and_resume(server: ServerProcess, prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "thr.jsonl"
    result = sweep(server, prompts, out)
    assert (result["written"], result["skipped"], result["errors"]) == (8, 0, 0)
    records = read(out)
    assert len(records) == 8 and len({record_key(r, KEYS) for r in records}) == 8
    for r in records:
        assert set(r) == set(TAGS) | set(RECORD_FIELDS) and r["error"] is None
        assert r["completion_tokens"] == 6  # ignore_eos: every request runs to its length
        assert r["start_time"] <= r["end_time"] and 0 < r["ttft"] <= r["e2e_latency"] + EPS
        assert r["tpot"] == pytest.approx(max(r["e2e_latency"] - r["ttft"], 0.0) / 5)
    by_level = {c: [r for r in records if r["concurrency"] == c] for c in (1, 3)}
    assert sorted(r["request_index"] for r in by_level[1]) == list(range(4))
    assert max_overlap(by_level[1]) == 1
    assert max_overlap(by_level[3]) <= 3
    for c in (1, 3):
        s = result["levels"][c]
        assert s["requests"] == 4 and s["errors"] == 0 and s["output_tokens"] == 24
        assert s["output_tokens_per_s"] > 0 and s["e2e_p50"] <= s["e2e_p90"] <= s["e2e_p99"]
        typed = [r for r in read_record_file(out, ThroughputRecord, TAGS) if r.concurrency == c]
        assert s == {**summarize_level(typed), "concurrency": c, "resumed": 0}

    again = sweep(server, prompts, out)
    assert (again["written"], again["skipped"]) == (0, 8) and read(out) == records
    assert again["levels"][3]["resumed"] == 4 and again["levels"][3]["output_tokens"] == 24

    # crash during the second level: 5 records kept, the 6th torn
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])
    resumed = sweep(server, prompts, out)
    assert (resumed["written"], resumed["skipped"]) == (3, 5)
    final = read(out)
    assert len(final) == len({record_key(r, KEYS) for r in final}) == 8


def test_cli_prints_a_table(server: ServerProcess, prompts: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "thr.jsonl"
    argv = ["bench", "throughput", "--url", server.url, "--prompts", str(prompts), "--concurrency", "2",
            "--num-requests", "2", "--max-new-tokens", "3", "--tags", json.dumps(TAGS), "--out", str(out)]
    assert ddtree_main(argv) == 0
    printed = capsys.readouterr().out
    assert "out tok/s" in printed and "e2e p50" in printed
    assert [r["concurrency"] for r in read(out)] == [2, 2]


def test_bad_arguments_are_refused(prompts: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        run_throughput("http://127.0.0.1:9", prompts, concurrency="0,2", num_requests=1, max_new_tokens=1,
                       out=tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="tags"):
        run_throughput("http://127.0.0.1:9", prompts, concurrency=[1], num_requests=1, max_new_tokens=1,
                       tags={"concurrency": 3}, out=tmp_path / "x.jsonl")
