"""Aggregation on records generated here in the shapes of docs/CONTRACTS.md."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ddtree.pipeline.aggregate import build_tables, load_run_records, write_tables

VARIANTS = [
    {"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0},
    {"name": "t1", "temperature": 1.0, "top_k": -1, "top_p": 1.0},
]


def acceptance_record(tags, prompt_id, variant, output_ids, accept_lens, *, decode_time, sample_index=0):
    rounds = len(accept_lens)
    return {
        **tags, "prompt_id": prompt_id, "dataset": "stdlib-heldout", "variant": variant["name"],
        "temperature": variant["temperature"], "top_k": variant["top_k"], "top_p": variant["top_p"],
        "sample_index": sample_index, "seed": 1000 + sample_index, "prompt_tokens": 12,
        "completion_tokens": len(output_ids), "spec_verify_ct": rounds,
        "tau": (sum(accept_lens) + rounds) / max(rounds, 1), "accept_lens": accept_lens,
        "expected_accept_lens": [a + 0.25 for a in accept_lens],
        "stage_times": {"draft": 0.01 * rounds, "tree_build": 0.002 * rounds, "tree_compile": 0.001 * rounds,
                        "verify": 0.02 * rounds, "commit": 0.001 * rounds},
        "e2e_latency": decode_time + 0.05, "ttft": 0.05, "decode_time": decode_time, "output_ids": output_ids,
        "error": None,
    }


def throughput_record(tags, concurrency, index, start, end, tokens=16, error=None):
    return {**tags, "concurrency": concurrency, "request_index": index, "prompt_id": f"p{index}",
            "completion_tokens": tokens, "e2e_latency": end - start, "ttft": 0.01,
            "tpot": (end - start - 0.01) / (tokens - 1), "start_time": start, "end_time": end, "error": error}


@pytest.fixture()
def records():
    rng = np.random.default_rng(1)
    ar = {"profile": "cpu", "pair": "tiny", "method": "ar", "budget": None}
    dd = {"profile": "cpu", "pair": "tiny", "method": "ddtree", "budget": 8}
    acc, thr = [], []
    for p in range(4):
        greedy_out = [p, 1, 2, 3, 4, 5, 6, 7]
        acc.append(acceptance_record(ar, f"p{p}", VARIANTS[0], greedy_out, [0] * 8, decode_time=0.7))
        spec_out = greedy_out if p < 3 else [p, 1, 2, 9, 9, 9, 9, 9]  # one prompt diverges at index 3
        acc.append(acceptance_record(dd, f"p{p}", VARIANTS[0], spec_out, [3, 1, 2], decode_time=0.35))
        for s in range(25):
            acc.append(acceptance_record(ar, f"p{p}", VARIANTS[1], [p] + rng.integers(0, 3, 7).tolist(), [0] * 8,
                                         decode_time=0.7, sample_index=s))
            acc.append(acceptance_record(dd, f"p{p}", VARIANTS[1], [p] + rng.integers(0, 3, 7).tolist(), [2, 0, 1],
                                         decode_time=0.35, sample_index=s))
    for c in (1, 2):
        for i in range(4):
            thr.append(throughput_record(ar, c, i, start=float(i), end=float(i) + 1.0))
            thr.append(throughput_record(dd, c, i, start=float(i), end=float(i) + 0.5))
    thr.append(throughput_record(dd, 2, 4, start=0.0, end=0.1, error="timeout"))
    return acc, thr


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


def test_load_run_records_and_write_tables(records, tmp_path):
    acc, thr = records
    plan = {"tags": {"profile": "cpu", "pair": "tiny", "method": "ar", "budget": None},
            "out": {"acceptance": str(tmp_path / "a.jsonl"), "throughput": str(tmp_path / "missing.jsonl"),
                    "summary": str(tmp_path / "s.json")}}
    lines = [json.dumps({k: v for k, v in r.items() if k not in plan["tags"]}) for r in acc if r["method"] == "ar"]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + '\n{"prompt_id": "trunc')  # a killed writer's last line
    (tmp_path / "plan.json").write_text(json.dumps(plan))
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
