"""benchmarks/attention_launch_sweep.py end to end on a tiny shape: every timed launch is checked against the
reference and says so in the JSON. Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (times meaningless)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from ddtree.engine import triton_attention

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_launch_sweep.py"
ON_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(not triton_attention.HAS_TRITON or not (ON_CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="needs triton and CUDA, or TRITON_INTERPRET=1")
def test_sweep_checks_every_launch(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("attention_launch_sweep", SCRIPT)
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, sweep)  # dataclasses look their module up there
    spec.loader.exec_module(sweep)
    out = tmp_path / "sweep.json"
    argv = ["--device", "cuda" if ON_CUDA else "cpu", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
            "--context", "40", "--batch-sizes", "1", "--widths", "1,5", "--grid", "small", "--repeats", "1",
            "--layers", "1", "--compile-workers", "0", "--json-out", str(out)]
    assert sweep.main(argv) == 0
    report = json.loads(out.read_text())
    assert [(c["batch"], c["width"]) for c in report["cells"]] == [(1, 1), (1, 5)]
    for cell in report["cells"]:
        assert cell["configs"], "the small grid keeps at least one launch per cell"
        splits = {c["launch"]["splits"] for c in cell["configs"]}
        assert 1 in splits and max(splits) > 1  # the direct and the merged path
        for config in [cell["default"], *cell["configs"]]:
            assert config["correct"] is True and config["status"] == "ok", config
            assert config["max_abs_err"] <= cell["tolerance"] and config["ms"] > 0
        assert cell["best"] is not None and cell["sdpa"]["ms"] > 0
