"""benchmarks/: scripts at the top (or in a topic folder), raw results under results/<date>/<run>/, each run with a
README and a row in benchmarks/README.md; shell scripts only call programs (no Python inside them)."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCHMARKS / "results"


def _runs() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*/*") if p.is_dir())


def test_raw_results_live_under_results_by_date() -> None:
    outside = [str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.rglob("*")
               if p.is_file() and RESULTS not in p.parents and p.suffix not in (".py", ".sh", ".md")]
    assert outside == []
    assert [p.name for p in RESULTS.iterdir()] and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.name)
                                                       for p in RESULTS.iterdir())
    assert not [p for p in RESULTS.rglob("*.py")], "scripts belong at benchmarks/ or benchmarks/<topic>/"


def test_every_run_has_a_readme_and_a_row() -> None:
    index = (BENCHMARKS / "README.md").read_text()
    assert _runs()
    for run in _runs():
        assert (run / "README.md").is_file(), run
        assert f"`{run.relative_to(BENCHMARKS)}/`" in index, f"{run} has no row in benchmarks/README.md"


def test_shell_scripts_hold_no_python() -> None:
    # the scripts kept beside raw results are the record of what ran then; they stay as they were
    scripts = sorted(p for p in BENCHMARKS.rglob("*.sh") if RESULTS not in p.parents)
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert not re.search(r"python3?\s+-c\b|<<", text), f"{script}: inline Python or a heredoc"
        for called in re.findall(r"python3?\s+(benchmarks/\S+\.py)", text):
            assert (BENCHMARKS.parent / called).is_file(), f"{script} calls {called}, which does not exist"
