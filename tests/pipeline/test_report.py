"""Report panels: figures and tables from generated records, visible notes when data are missing."""

from __future__ import annotations

import pandas as pd
import pytest
from record_factory import make_records

from ddtree.pipeline import report
from ddtree.pipeline.aggregate import build_tables, write_tables


@pytest.fixture()
def tables(tmp_path):
    acc, thr = make_records()
    write_tables(build_tables(acc, thr, positions=(1, 2)), tmp_path)
    return report.load_tables(tmp_path, profile="cpu")


def test_every_profile_panel_has_a_figure_and_its_numbers(tables):
    panels = report.profile_panels(tables)
    assert [p.title for p in panels] == [
        "Speedup and tau vs budget", "Temperature sweep", "Accept-length distribution, greedy vs sampled",
        "Observed vs expected acceptance", "Throughput and latency vs concurrency", "Per-stage time per round",
        "Losslessness (with the power panel)",
    ]
    for panel in panels:
        assert panel.figure is not None, panel.title
        assert not panel.table.empty, panel.title
        assert report.figure_png(panel.figure).startswith(b"\x89PNG")
    speed = panels[0]
    assert any("1 ddtree budget" in note for note in speed.notes)  # the records have one budget
    assert (speed.table.set_index("run").loc["ar"].filter(like="tau ") == 1.0).all()  # one token a forward
    ddtree = speed.table.set_index("run").loc["ddtree-b8"]
    assert [ddtree["speedup greedy"], ddtree["speedup t1"]] == pytest.approx([2.0, 2.0])
    assert any("failed" in note for note in panels[4].notes)  # one throughput request errored


def test_missing_data_gives_notes_not_errors(tmp_path):
    empty = report.load_tables(tmp_path / "nothing", profile="cpu")
    assert all(frame.empty for frame in empty.values())
    for panel in report.profile_panels(empty) + [report.hardware_summary(empty)]:
        assert panel.figure is None and panel.notes, panel.title


def test_other_profiles_are_filtered_out(tables, tmp_path):
    assert set(tables["acceptance"]["profile"]) == {"cpu"}
    acc, thr = make_records()
    write_tables(build_tables(acc, thr), tmp_path / "t")
    assert report.load_tables(tmp_path / "t", profile="h200-x1")["acceptance"].empty


def test_hardware_summary_picks_the_best_budget(tables):
    panel = report.hardware_summary(tables)
    row = panel.table.set_index("variant").loc["greedy"]
    assert row["budget"] == 8 and row["speedup"] == pytest.approx(2.0)
    assert any("one hardware profile" in note for note in panel.notes)
    assert isinstance(panel.table, pd.DataFrame)


def test_stage_times_that_were_not_recorded_give_a_note_not_a_plot_of_zeros(tables):
    """Servers on CUDA time no stages by default: the per-stage panel says so and how to record them."""
    tables = dict(tables, stages=tables["stages"].assign(seconds=0.0))
    panel = report.stages_panel(tables)
    assert panel.figure is None
    assert any("--stage-times on" in note for note in panel.notes)
