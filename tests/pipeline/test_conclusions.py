"""The report's header: conclusions that name the numbers of the tables, warnings a reader cannot miss."""

from __future__ import annotations


import pandas as pd
import pytest
from record_factory import acceptance_record, make_records

from ddtree.pipeline import conclusions
from ddtree.pipeline.aggregate import build_tables
from ddtree.pipeline.envinfo import environment_rows, training_summary


@pytest.fixture()
def tables():
    acc, thr = make_records()
    return build_tables(acc, thr, positions=(1, 2))


def test_conclusions_name_the_numbers_of_the_tables(tables):
    h = conclusions.header(tables, pd.DataFrame())
    table, speed = h.table.set_index("variant"), tables["speedup"]
    text = "\n".join(h.conclusions)
    for variant, row in table.iterrows():
        ddtree = speed[(speed["variant"] == variant) & (speed["method"] == "ddtree")]
        best = ddtree.loc[ddtree["speedup"].idxmax()]
        ar = speed[(speed["variant"] == variant) & (speed["method"] == "ar")]
        # the conclusions table holds the speedup table's numbers ...
        assert row["best_budget"] == best["budget"] and row["speedup_vs_ar"] == pytest.approx(best["speedup"])
        assert row["ddtree_tau"] == pytest.approx(best["tau"])
        assert row["ar_ms_per_token"] == pytest.approx(1e3 * float(ar["mean_tpot"].iloc[0]))
        assert row["speedup_vs_ar_lo"] <= row["speedup_vs_ar"] <= row["speedup_vs_ar_hi"]
        # ... and the text names them, formatted once
        line = next(line for line in h.conclusions if line.startswith(f"**{variant} "))
        for value in ("speedup_vs_ar", "speedup_vs_ar_lo", "speedup_vs_ar_hi", "ddtree_tau", "ddtree_ms_per_token",
                      "ar_ms_per_token"):
            assert conclusions.fmt(float(row[value])) in line, (variant, value, line)
        assert f"best ddtree budget {int(row['best_budget'])}" in line
    match = tables["greedy_match"]
    assert f"{int(match['matches'].sum())} of {int(match['n'].sum())} speculative outputs" in text
    combined = tables["sampling_test"][tables["sampling_test"]["position"] == -1]
    assert f"Cohen's w = {conclusions.fmt(float(combined['detectable_w'].median()))}" in text


def test_bootstrap_ci_covers_the_ratio_and_narrows_with_more_requests():
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.normal(2.0, 0.3, 20), rng.normal(1.0, 0.15, 20)
    lo, hi = conclusions.bootstrap_ratio(a, b)
    assert lo < a.mean() / b.mean() < hi
    lo2, hi2 = conclusions.bootstrap_ratio(rng.normal(2.0, 0.3, 400), rng.normal(1.0, 0.15, 400))
    assert hi2 - lo2 < (hi - lo) / 2


def test_a_pair_cut_short_and_failed_requests_are_warned_in_words(tables):
    manifest = {"training": {"target": {"steps": 500, "stopped_by": "max_steps"},
                             "drafter": {"steps": 312, "stopped_by": "deadline"}}}  # an older manifest
    summary = training_summary(manifest)
    assert summary["complete"] is False and "drafter stopped at step 312" in summary["incomplete_reason"]
    env = pd.DataFrame(environment_rows({"pairs": {"tiny": {"training": summary}}}))
    acc = tables["acceptance"].copy()
    acc.loc[acc.index[0], "error"] = "timeout"
    h = conclusions.header({**tables, "acceptance": acc}, env)
    assert any("NOT trained to its schedule" in w and "step 312" in w for w in h.warnings)
    assert any("1 of" in w and "acceptance requests failed" in w for w in h.warnings)
    html = conclusions.header_markdown(h)
    assert html.count("<b>Warning:</b>") == len(h.warnings) and "## Conclusions" in html
    complete = pd.DataFrame(environment_rows({"pairs": {"tiny": {"training": training_summary(
        {"training": {"complete": True, "target": {"stopped_by": "max_steps"}, "drafter": {"stopped_by": "max_steps"}}})}}}))
    assert conclusions.pair_warnings(complete, ["tiny"]) == []


def test_crossover_and_power_panel_lines():
    base = {"pair": "p", "top_k": -1, "top_p": 1.0}
    table = pd.DataFrame([{**base, "variant": v, "temperature": t, "speedup_vs_ar": s}
                          for v, t, s in (("greedy", 0.0, 1.5), ("t0.3", 0.3, 1.1), ("t0.6", 0.6, 0.8), ("t1", 1.0, 0.5))])
    assert conclusions.crossover(table) == "Crossover: from T = 0.6 the best ddtree is slower than ar (0.80x) " \
                                          "(still 1.10x at T = 0.3)."
    rounds = [1, 1, 1, 1] * 10
    lossy = {"profile": "cpu", "pair": "p", "method": "ddtree", "budget": 8, "verifier": "greedy_accept"}
    variant = {"name": "t1", "temperature": 1.0, "top_k": -1, "top_p": 1.0}
    recs = [acceptance_record(lossy, f"q{i}", variant, [1, 2, 3], rounds, decode_time=0.1) for i in range(3)]
    for r in recs:
        r["expected_accept_lens"] = [0.5 + 0.01 * (k % 3) for k in range(len(rounds))]
    lines, _ = conclusions.lossless_summary(build_tables(recs, [], positions=(1,)))
    assert any(line.startswith("Power panel: the deliberately lossy verifier `greedy_accept` is REJECTED")
               for line in lines)


def _summary(method: str, budget: int | None, cpus: int, loads: tuple[float, float] | None) -> dict:
    tags = {"profile": "cpu", "pair": "tiny", "method": method, "budget": budget, "verifier": "exact"}
    out = {"plan": {"tags": tags}, "cpus": cpus}
    if loads is not None:
        out["load"] = [{"at": "acceptance", "load_1m": loads[0]}, {"at": "throughput", "load_1m": loads[1]}]
    return out


def test_a_busy_machine_is_warned_and_a_quiet_one_is_not(tables):
    quiet = [_summary("ar", None, 2, (1.1, 1.4)), _summary("ddtree", 16, 2, (1.0, 1.3))]
    busy = [_summary("ar", None, 2, (1.1, 1.4)), _summary("ddtree", 16, 2, (3.2, 2.9))]
    old = [_summary("ar", None, 2, None)]  # a summary from before sessions recorded load: no row, no warning
    for summaries, warned in ((quiet, False), (busy, True), (old, False)):
        load = build_tables([], [], summaries=summaries)["machine_load"]
        assert len(load) == sum("load" in s for s in summaries)
        h = conclusions.header({**tables, "machine_load": load}, pd.DataFrame())
        hits = [w for w in h.warnings if "machine was busy" in w]
        assert bool(hits) == warned
        if warned:
            assert "1 of 2 runs" in hits[0] and "ddtree-b16" in hits[0] and "3.2 on 2 cores" in hits[0]
            assert "ar" not in hits[0].split("(")[1].split(")")[0].split(", ")
