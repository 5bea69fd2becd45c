"""JSON-lines result files that survive crashes and resume.

Each record is appended and flushed as it arrives, so a crash loses at most the line being written.
Opening an existing file reads the records already there (a torn last line is dropped) and
remembers their keys, so a rerun skips work that is done instead of redoing it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddtree.jsonl import json_lines

log = logging.getLogger(__name__)


def record_key(record: Mapping[str, Any], fields: Sequence[str]) -> str:
    """Canonical identity of a record: the JSON of its values for `fields` (missing = null)."""
    return json.dumps([record.get(f) for f in fields], sort_keys=True, separators=(",", ":"), default=str)


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """All well-formed JSON-object lines of `path` and the number of lines dropped as corrupt (a resumed file
    is repaired, not refused: any torn write from a crash is dropped)."""
    if not Path(path).exists():
        return [], 0
    values = [value for _, value, _ in json_lines(path)]
    records = [value for value in values if isinstance(value, dict)]
    return records, len(values) - len(records)


def _ends_with_newline(path: Path) -> bool:
    """An empty or missing file counts as ending cleanly; appending after a torn tail would glue lines."""
    if not path.exists() or path.stat().st_size == 0:
        return True
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _rewrite(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RecordWriter:
    """Append-only JSON-lines writer keyed by `key_fields`.

    With `retry_errors` (the default), records whose `error` is set are not counted as done: they
    are removed from the file when it is opened, so the rerun replaces them rather than
    duplicating their key.
    """

    def __init__(self, path: str | Path, key_fields: Sequence[str], *, retry_errors: bool = True) -> None:
        if not key_fields:
            raise ValueError("key_fields must name at least one field")
        self.path = Path(path)
        self.key_fields = list(key_fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records, dropped = read_records(self.path)
        kept = [r for r in records if not (retry_errors and r.get("error"))]
        if dropped or len(kept) != len(records) or not _ends_with_newline(self.path):
            log.warning("%s: dropping %d corrupt and %d failed records before resuming", self.path, dropped,
                        len(records) - len(kept))
            _rewrite(self.path, kept)
        self.existing: list[dict[str, Any]] = kept
        self._done = {record_key(r, self.key_fields) for r in kept}
        self.written = 0
        self.skipped = 0
        self._fh = self.path.open("a", encoding="utf-8")

    def key(self, record: Mapping[str, Any]) -> str:
        return record_key(record, self.key_fields)

    def is_done(self, record: Mapping[str, Any]) -> bool:
        """True when a record with the same key is already stored (counts it as skipped)."""
        done = self.key(record) in self._done
        self.skipped += int(done)
        return done

    def write(self, record: Mapping[str, Any]) -> None:
        key = self.key(record)
        if key in self._done:
            raise ValueError(f"record key {key} is already in {self.path}")
        self._fh.write(json.dumps(dict(record), default=str) + "\n")
        self._fh.flush()
        self._done.add(key)
        self.written += 1

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
