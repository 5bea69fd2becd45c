"""The report notebooks run on their own with papermill (no Snakemake object injected)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from record_factory import make_records

from ddtree.pipeline.aggregate import build_tables, write_tables

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("name", ["profile_report.ipynb", "summary.ipynb"])
def test_notebook_has_one_parameters_cell(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "tables_dir" in tagged[0].source
    assert "snakemake" not in "".join(c.source for c in nb.cells)


@pytest.mark.parametrize("name, params", [("profile_report.ipynb", ["-p", "profile", "cpu"]),
                                          ("summary.ipynb", [])])
def test_notebook_runs_standalone_with_papermill(tmp_path, name, params):
    acc, thr = make_records()
    write_tables(build_tables(acc, thr), tmp_path / "tables")
    out = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "papermill", str(NOTEBOOKS / name), str(out), "-p", "tables_dir",
         str(tmp_path / "tables"), *params, "-k", "python3"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = [o for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3
