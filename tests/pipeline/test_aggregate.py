"""Aggregation on records generated here (`ddtree.bench.schema` records, see record_factory)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from record_factory import make_records

from ddtree.bench.schema import AcceptancePhase, BenchPlan, PlanOutputs, ServerSpec, write_plan
from ddtree.pipeline.aggregate import build_tables, load_run_records, write_tables


@pytest.fixture()
def records():
    return make_records()


def test_tables_have_expected_values(records):
    acc, thr = records
    tables = build_tables(acc, thr, positions=(0, 1, 2), alpha=0.01)
    acceptance = tables["acceptance"]
    assert len(acceptance) == len(acc)
    assert np.isnan(acceptance.loc[acceptance.method == "ar", "budget"]).all()
    row = acceptance[(acceptance.method == "ddtree") & (acceptance.variant == "greedy")].iloc[0]
    assert row.tau == pytest.approx((6 + 3) / 3)
    assert row.mean_expected_accept_len == pytest.approx(2.25)
    assert row.tpot == pytest.approx(0.35 / 7)

    speed = tables["speedup"].set_index(["variant", "method"])
    assert speed.loc[("greedy", "ddtree"), "speedup"] == pytest.approx(2.0)
    assert speed.loc[("greedy", "ar"), "speedup"] == pytest.approx(1.0)

    hist = tables["accept_hist"]
    dd_greedy = hist[(hist.method == "ddtree") & (hist.variant == "greedy")].set_index("accept_len")
    assert dd_greedy["rounds"].to_dict() == {1: 4, 2: 4, 3: 4}
    assert dd_greedy["fraction"].sum() == pytest.approx(1.0)

    stages = tables["stages"]
    dd_stage = stages[(stages.method == "ddtree") & (stages.variant == "greedy")].set_index("stage")
    assert dd_stage.loc["verify", "seconds_per_round"] == pytest.approx(0.02)
    assert dd_stage["fraction"].sum() == pytest.approx(1.0)

    thr_table = tables["throughput"].set_index(["method", "concurrency"])
    assert thr_table.loc[("ar", 1), "output_tok_per_s"] == pytest.approx(4 * 16 / 4.0)
    assert thr_table.loc[("ddtree", 2), "errors"] == 1
    assert thr_table.loc[("ddtree", 2), "output_tok_per_s"] == pytest.approx(4 * 16 / 3.5)

    match = tables["greedy_match"]
    assert len(match) == 1
    assert match.iloc[0]["match_rate"] == pytest.approx(0.75)
    assert match.iloc[0]["mean_prefix_fraction"] == pytest.approx((3 + 3 / 8) / 4)

    test = tables["sampling_test"]
    assert list(test["position"]) == [0, 1, 2, -1]
    assert test["alpha"].eq(0.01).all()
    # Position 0 holds each prompt's id: the same law under both methods by construction.
    assert test.iloc[0]["p_value"] == pytest.approx(1.0)


def _plan(tmp_path) -> BenchPlan:
    return BenchPlan(server=ServerSpec(model="m", method="ar"), prompts="p.jsonl", acceptance=AcceptancePhase(),
                     tags={"profile": "cpu", "pair": "tiny", "method": "ar", "budget": None},
                     out=PlanOutputs(acceptance=str(tmp_path / "a.jsonl"), throughput=str(tmp_path / "missing.jsonl"),
                                     summary=str(tmp_path / "s.json")))


def test_load_run_records_and_write_tables(records, tmp_path):
    acc, thr = records
    lines = [json.dumps(r) for r in acc if r["method"] == "ar"]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + '\n{"prompt_id": "trunc')  # a killed writer's last line
    write_plan(tmp_path / "plan.json", _plan(tmp_path))
    loaded_acc, loaded_thr = load_run_records([tmp_path / "plan.json"])
    assert len(loaded_acc) == len(lines) and loaded_thr == []
    assert all(r["method"] == "ar" and r["profile"] == "cpu" for r in loaded_acc)

    tables = build_tables(loaded_acc, loaded_thr)
    assert tables["throughput"].empty and tables["greedy_match"].empty
    written = write_tables(tables, tmp_path / "tables")
    assert len(written) == 2 * len(tables)
    back = pd.read_parquet(tmp_path / "tables" / "acceptance.parquet")
    assert len(back) == len(lines)


def test_empty_inputs_give_empty_tables_with_columns():
    tables = build_tables([], [])
    for name, frame in tables.items():
        assert frame.empty and len(frame.columns) > 0, name


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("schema_version"), "missing field `schema_version`"),
        (lambda r: r.update(schema_version=0), "`schema_version`: this code reads version 1, got 0"),
        (lambda r: r.pop("tau"), "missing field `tau`"),
        (lambda r: r.pop("pair"), "missing field `pair`"),
        (lambda r: r.update(rounds=3), "unknown field `rounds`"),
        (lambda r: r.update(accept_lens=[1, "2"]), "`accept_lens[1]`: expected int"),
    ],
)
def test_a_record_outside_the_schema_is_refused_naming_file_line_and_field(records, tmp_path, edit, message):
    acc, _ = records
    rows = [r for r in acc if r["method"] == "ar"][:3]
    edit(rows[1])
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_plan(tmp_path / "plan.json", _plan(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'a.jsonl'} line 2: ") + ".*" + re.escape(message)):
        load_run_records([tmp_path / "plan.json"])
