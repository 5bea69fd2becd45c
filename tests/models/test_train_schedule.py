"""A wall-clock limit never silently shortens a step-scheduled pair (issue 14, item 1)."""

import json
import math
import subprocess
import sys

import pytest
import torch

from ddtree.models.sizes import get_size
from ddtree.models.train import LoopResult, phase_budgets, run_loop, training_status


def test_step_schedules_have_no_wall_clock_limit_unless_asked():
    for name in ("tiny", "small", "gpu"):
        assert phase_budgets(get_size(name), None) == (math.inf, math.inf)
    t, d = phase_budgets(get_size("small"), 10.0)
    assert t + d == pytest.approx(600.0) and t > 0 and d > 0
    with pytest.raises(ValueError, match="max_minutes"):
        phase_budgets(get_size("small"), 0.0)


def test_run_loop_reports_the_deadline_and_the_steps_reached():
    w = torch.nn.Parameter(torch.zeros(3))

    def step(_: int) -> float:
        loss = (w - 1.0).pow(2).sum()
        loss.backward()
        return float(loss.detach())

    full = run_loop(step, [w], peak_lr=1e-2, budget_s=math.inf, max_steps=20, log_every=100, desc="t",
                    progress=False, log_file=None, schedule="steps")
    assert (full.steps, full.stopped_by) == (20, "max_steps")
    cut = run_loop(step, [w], peak_lr=1e-2, budget_s=0.0, max_steps=20, log_every=100, desc="t",
                   progress=False, log_file=None, schedule="steps")
    assert (cut.steps, cut.stopped_by) == (0, "deadline")


def test_training_status_names_the_phase_cut_short():
    spec = get_size("small")
    done_t = LoopResult(spec.target_max_steps, 1.0, 3.0, "max_steps", 1)
    done_d = LoopResult(spec.drafter_max_steps, 1.0, 3.0, "max_steps", 1)
    cut_d = LoopResult(312, 1.0, 3.0, "deadline", 1)
    assert training_status(spec, done_t, done_d, spec.rollout_rows) == {"complete": True, "incomplete_reason": None}
    status = training_status(spec, done_t, cut_d, spec.rollout_rows)
    assert status["complete"] is False
    assert f"drafter stopped at step 312 of {spec.drafter_max_steps}" in status["incomplete_reason"]
    short_pool = training_status(spec, done_t, done_d, 64)
    assert short_pool["complete"] is False and "64 of" in short_pool["incomplete_reason"]


@pytest.mark.slow
def test_train_pair_cli_fails_when_its_limit_cuts_training(tmp_path):
    out = tmp_path / "pair"
    proc = subprocess.run(
        [sys.executable, "-m", "ddtree.cli", "train-pair", "--size", "tiny", "--out", str(out), "--no-eval",
         "--no-progress", "--max-minutes", "0.001"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "NOT the tiny pair" in proc.stderr
    training = json.loads((out / "manifest.json").read_text())["training"]
    assert training["complete"] is False and training["target"]["stopped_by"] == "deadline"
