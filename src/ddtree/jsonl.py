"""JSON-lines files (prompts, benchmark records, training logs): the project's one reader and one writer; and the
atomic write of a JSON file that another process reads (a plan, a session summary).

A killed writer can leave its last line torn; readers skip that line and nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any


NOT_JSON: Any = object()  # what `json_lines` yields for a line that does not parse


def json_lines(path: str | Path) -> Iterator[tuple[int, Any, bool]]:
    """(line number from 1, parsed value or NOT_JSON, whether it is the last non-blank line) of each non-blank line."""
    with open(path, encoding="utf-8") as handle:
        lines = [(number, line) for number, line in enumerate(handle.read().splitlines(), 1) if line.strip()]
    for index, (number, line) in enumerate(lines):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = NOT_JSON
        yield number, value, index == len(lines) - 1


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file; a torn last line is skipped, any other bad line raises naming it."""
    rows: list[dict[str, Any]] = []
    for number, value, last in json_lines(path):
        if value is NOT_JSON and last:
            break
        if not isinstance(value, dict):
            what = "not valid JSON" if value is NOT_JSON else "not a JSON object"
            raise ValueError(f"{path}: line {number} is {what}")
        rows.append(value)
    return rows


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write (replace) a JSON-lines file, one object a line; returns the number of lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Write a JSON file (indented, values JSON cannot hold as strings) so that a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
