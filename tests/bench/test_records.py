"""Crash-safe, resumable JSON-lines records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree.bench.records import RecordWriter, read_records, record_key

KEYS = ["method", "prompt_id", "sample_index"]


def rec(i: int, error: str | None = None) -> dict:
    return {"method": "ddtree", "prompt_id": f"p{i}", "sample_index": 0, "tau": 1.0 + i, "error": error}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_on_disk_as_soon_as_written(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.jsonl"
    writer = RecordWriter(out, KEYS)
    writer.write(rec(0))
    assert lines(out) == [rec(0)]  # flushed before close: a crash now loses nothing
    writer.write(rec(1))
    assert lines(out) == [rec(0), rec(1)]
    writer.close()


def test_rerun_skips_present_keys(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with RecordWriter(out, KEYS) as writer:
        for i in range(3):
            writer.write(rec(i))
    with RecordWriter(out, KEYS) as writer:
        todo = [i for i in range(5) if not writer.is_done(rec(i))]
        for i in todo:
            writer.write(rec(i))
        assert todo == [3, 4] and writer.skipped == 3 and writer.written == 2
    keys = [record_key(r, KEYS) for r in lines(out)]
    assert len(keys) == len(set(keys)) == 5


def test_duplicate_write_is_refused(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "r.jsonl", KEYS) as writer:
        writer.write(rec(0))
        with pytest.raises(ValueError, match="already"):
            writer.write(rec(0))


def test_torn_last_line_is_dropped_and_the_file_stays_appendable(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(rec(0)) + "\n" + json.dumps(rec(1))[:15])  # crash mid-write
    with RecordWriter(out, KEYS) as writer:
        assert [r["prompt_id"] for r in writer.existing] == ["p0"]
        assert not writer.is_done(rec(1))
        writer.write(rec(1))
    assert lines(out) == [rec(0), rec(1)]


def test_complete_line_without_newline_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(rec(0)))
    with RecordWriter(out, KEYS) as writer:
        assert writer.is_done(rec(0))
        writer.write(rec(1))
    assert lines(out) == [rec(0), rec(1)]


def test_failed_records_are_retried_without_duplicates(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with RecordWriter(out, KEYS) as writer:
        writer.write(rec(0))
        writer.write(rec(1, error="HTTP 500"))
    with RecordWriter(out, KEYS) as writer:
        assert writer.is_done(rec(0)) and not writer.is_done(rec(1))
        writer.write(rec(1))
    assert lines(out) == [rec(0), rec(1)]
    with RecordWriter(out, KEYS, retry_errors=False) as writer:
        assert writer.is_done(rec(1))


def test_keys_include_tags(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with RecordWriter(out, KEYS) as writer:
        writer.write(rec(0))
    with RecordWriter(out, KEYS) as writer:
        assert not writer.is_done({**rec(0), "method": "dflash"})  # another tag value is other work


def test_read_records_of_missing_file(tmp_path: Path) -> None:
    assert read_records(tmp_path / "none.jsonl") == ([], 0)


def test_key_fields_required(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key_fields"):
        RecordWriter(tmp_path / "r.jsonl", [])
