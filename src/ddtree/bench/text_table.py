"""The benchmarks' printed tables: cells in right-aligned columns, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[str]], *, rule: bool = False) -> str:
    """`rows[0]` is the header; `rule` puts a dashed line under it."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
