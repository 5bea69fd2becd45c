"""benchmarks/gpu_pair/serve_sweep.py without a server: how a level sizes its batches, and the summary's cells."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_pair" / "serve_sweep.py"


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serve_sweep", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sizes(sweep: ModuleType, **kw: int | float) -> dict[str, int | float]:
    return {"min_requests": 16, "min_seconds": 3.0, "max_requests": 2000, **kw}


def test_first_batch_is_max_of_min_requests_and_two_waves(sweep: ModuleType) -> None:
    assert sweep.next_batch(1, [], **sizes(sweep)) == 16
    assert sweep.next_batch(16, [], **sizes(sweep)) == 32
    assert sweep.next_batch(16, [], **sizes(sweep, max_requests=20)) == 20


def test_a_batch_of_min_seconds_ends_the_level(sweep: ModuleType) -> None:
    assert sweep.next_batch(4, [(16, 3.0)], **sizes(sweep)) == 0
    assert sweep.next_batch(4, [(16, 0.4), (200, 3.2)], **sizes(sweep)) == 0


def test_a_short_batch_is_followed_by_a_larger_one_of_whole_waves_sized_from_its_rate(sweep: ModuleType) -> None:
    for level, first in [(1, (16, 0.48)), (4, (16, 0.23)), (16, (32, 0.31))]:
        n = sweep.next_batch(level, [first], **sizes(sweep))
        assert n > first[0] and n % level == 0
        assert n * first[1] / first[0] >= 3.0 * sweep.MARGIN  # at the probe's rate it would last past min_seconds


def test_the_larger_batch_is_cut_to_max_requests_and_the_time_left(sweep: ModuleType) -> None:
    probe = [(16, 0.5)]  # 32 requests/s: 144 wanted for 3 s x MARGIN 1.5
    assert sweep.next_batch(4, probe, **sizes(sweep, max_requests=100)) == 84
    assert sweep.next_batch(4, probe, **sizes(sweep), seconds_left=2.0) == 64
    # a cut below the first batch's size is not worth a batch: the level reports what it has
    assert sweep.next_batch(4, probe, **sizes(sweep, max_requests=30)) == 0
    assert sweep.next_batch(4, probe, **sizes(sweep), seconds_left=0.2) == 0


@pytest.mark.parametrize("ramp_s, per_s, expected_batches", [(0.02, 100.0, 2), (0.15, 300.0, 3)])
def test_a_simulated_level_ends_with_a_batch_of_min_seconds(sweep: ModuleType, ramp_s: float, per_s: float,
                                                            expected_batches: int) -> None:
    # every batch pays a fixed ramp, so a short probe underestimates the rate; a large ramp costs a third batch
    batches: list[tuple[int, float]] = []
    while n := sweep.next_batch(8, batches, **sizes(sweep)):
        batches.append((n, ramp_s + n / per_s))
    assert len(batches) == expected_batches and batches[-1][1] >= 3.0 and sum(n for n, _ in batches) <= 2000


def test_summary_marks_cells_not_measured(sweep: ModuleType) -> None:
    plan = {"methods": ["ar", "dflash", "ddtree"], "budgets": [16, 32], "temperatures": [0.0], "levels": [1, 2]}
    row = {"temperature": 0.0, "concurrency": 1, "requests": 40, "errors": 0, "duration_s": 3.1,
           "mean_tpot": 0.001, "level_requests": 56, "level_seconds": 3.6, "short": False}
    rows = [{**row, "method": "dflash", "budget": 0, "output_tokens_per_s": 1000.0},
            {**row, "method": "ddtree", "budget": 32, "output_tokens_per_s": 1200.0}]
    table = sweep.summary_table(rows, plan).splitlines()
    assert len(table) == 3
    c1, c2 = table[1].split(), table[2].split()
    assert c1[2] == "missing" and c1[3] == "1000.0" and c1[4] == "1200.0" and c1[5] == "32" and c1[6] == "1.20x"
    assert "16:missing" in c1 and "32:1200.0" in c1
    assert c2[2:5] == ["missing"] * 3
    text = sweep.report(rows, {"dflash": {"startup_s": 25.0}, "ddtree": {"startup_s": None}}, plan, "time budget")
    assert "ar not started" in text and "dflash 25.0 s" in text and "ddtree not ready" in text
    assert "stopped early (time budget)" in text


def test_repeats_report_medians_per_pass_ratios_and_spread(sweep: ModuleType) -> None:
    plan = {"methods": ["ar", "dflash", "ddtree"], "budgets": [16, 32], "temperatures": [0.0], "levels": [8]}
    base = {"temperature": 0.0, "concurrency": 8, "requests": 40, "errors": 0, "duration_s": 3.1,
            "mean_tpot": 0.001, "level_requests": 56, "level_seconds": 3.6, "short": False}
    rates = {("ar", 0): [100.0, 110.0, 90.0], ("dflash", 0): [200.0, 150.0, 180.0],
             ("ddtree", 16): [210.0, 200.0, 190.0], ("ddtree", 32): [240.0, 220.0, 260.0]}
    rows = [{**base, "method": m, "budget": b, "repeat": rep, "output_tokens_per_s": x}
            for (m, b), xs in rates.items() for rep, x in enumerate(xs)]
    table = sweep.summary_table(rows, plan).splitlines()
    cells = table[1].split()
    assert cells[2:6] == ["100.0", "180.0", "240.0", "32"]  # medians; best budget by median
    assert cells[6] == f"{240 / 180:.2f}x"
    text = sweep.report(rows, {m: {"startup_s": 1.0} for m in plan["methods"]}, plan, None)
    passes = [line.split() for line in text.splitlines() if line.split()[:2] == ["0", "8"] and len(line.split()) == 9]
    assert [p[2] for p in passes] == ["1", "2", "3"]
    assert [p[7] for p in passes] == ["1.20x", "1.47x", "1.44x"]  # ddtree(32) / dflash within each pass
    assert "spread (max / min over passes): ar 1.22, dflash 1.33, ddtree 1.18" in text


def test_loop_per_round_turns_two_snapshots_into_ms_per_round(sweep: ModuleType) -> None:
    before = {"rounds": 10, "row_rounds": 40, "admissions": 4, "launch_s": 0.01, "wait_s": 0.1, "post_s": 0.02,
              "admit_s": 0.03, "idle_s": 1.0}
    after = {"rounds": 110, "row_rounds": 840, "admissions": 54, "launch_s": 0.02, "wait_s": 0.2, "post_s": 0.07,
             "admit_s": 0.08, "idle_s": 1.0}
    got = sweep.loop_per_round(before, after)
    assert got == pytest.approx({"launch_ms": 0.1, "wait_ms": 1.0, "post_ms": 0.5, "admit_ms": 0.5, "idle_ms": 0.0,
                                 "rows": 8.0, "admissions": 0.5})
    assert sweep.loop_per_round(after, after) is None and sweep.loop_per_round(None, after) is None


def test_request_phases_and_their_table(sweep: ModuleType) -> None:
    before = {"requests": 10, "queue_s": 0.01, "engine_s": 0.2, "handoff_s": 0.005}
    after = {"requests": 110, "queue_s": 0.11, "engine_s": 2.2, "handoff_s": 0.105}
    phases = sweep.request_phases(before, after)
    assert phases == pytest.approx({"queue_ms": 1.0, "engine_ms": 20.0, "handoff_ms": 1.0})
    assert sweep.request_phases(after, after) is None and sweep.request_phases(None, after) is None
    plan = {"methods": ["ddtree"], "budgets": [32], "temperatures": [0.0], "levels": [8]}
    row = {"method": "ddtree", "budget": 32, "temperature": 0.0, "concurrency": 8, "requests": 400, "errors": 0,
           "duration_s": 1.0, "mean_tpot": 0.001, "e2e_p50": 0.0185, "output_tokens_per_s": 5e4,
           "level_requests": 416, "level_seconds": 1.2, "short": False, "request_phases": phases}
    lines = sweep.report([row], {"ddtree": {"startup_s": 20.0}}, plan, None).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("a request's time"))
    assert lines[at + 2].split() == ["ddtree", "32", "0", "8", "1.000", "20.000", "1.000", "20.000", "18.500"]
