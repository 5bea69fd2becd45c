"""Prompt preparation, hub staging's offline path and the environment record."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from ddtree.jsonl import read_jsonl, write_jsonl
from ddtree.pipeline import envinfo, stage
from ddtree.pipeline.prompts import (
    load_embedded_prompts,
    load_table_prompts,
    select_prompts,
)

HUB_PAIR = {
    "source": "hub",
    "target": {"repo": "Qwen/Qwen3-8B", "revision": "main"},
    "drafter": {"repo": "z-lab/Qwen3-8B-DFlash-b16", "revision": "main"},
}


def test_jsonl_round_trip_and_truncated_last_line(tmp_path):
    path = tmp_path / "x.jsonl"
    assert write_jsonl(path, [{"a": 1}, {"a": 2}]) == 2
    with open(path, "a") as handle:
        handle.write('{"a": 3')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1\n{"a": 2}\n')
    with pytest.raises(ValueError, match="line 1"):
        read_jsonl(path)


def test_embedded_and_table_prompts(tmp_path):
    (tmp_path / "prompts").mkdir()
    write_jsonl(tmp_path / "prompts" / "heldout.jsonl",
                [{"id": str(i), "dataset": "stdlib-heldout", "text": f"def f{i}("} for i in range(5)])
    prompts = load_embedded_prompts(tmp_path, "stdlib-heldout")
    assert [p["id"] for p in select_prompts(prompts, 3)] == ["0", "1", "2"]
    with pytest.raises(FileNotFoundError, match="only embedded pairs"):
        load_embedded_prompts(tmp_path / "missing", "stdlib-heldout")

    pd.DataFrame({"task_id": ["a", "b"], "prompt": ["x", "y"]}).to_parquet(tmp_path / "t.parquet")
    rows = load_table_prompts(tmp_path / "t.parquet", "humaneval", "prompt", "task_id")
    assert rows == [{"id": "humaneval-a", "dataset": "humaneval", "text": "x"},
                    {"id": "humaneval-b", "dataset": "humaneval", "text": "y"}]
    write_jsonl(tmp_path / "m.jsonl", [{"turns": ["first", "second"]}])
    assert load_table_prompts(tmp_path / "m.jsonl", "mt", "turns.0")[0]["text"] == "first"
    with pytest.raises(ValueError, match="no field 'nope'"):
        load_table_prompts(tmp_path / "m.jsonl", "mt", "nope")
    with pytest.raises(ValueError, match="num_prompts"):
        select_prompts(rows, 0)


def test_offline_hub_pair_fails_at_once_naming_model_and_remedies(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert stage.hub_offline_reason() == "HF_HUB_OFFLINE is set"
    with pytest.raises(stage.HubUnavailableError) as info:
        stage.stage_hub_pair("qwen3-8b", HUB_PAIR, tmp_path / "qwen3-8b")
    message = str(info.value)
    for needle in ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "HF_TOKEN", "pre-download", "embedded"):
        assert needle in message
    assert not (tmp_path / "qwen3-8b" / "manifest.json").exists()


def test_unreachable_endpoint_is_detected_quickly(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    reason = stage.hub_offline_reason(endpoint="http://127.0.0.1:9", timeout_s=1.0)
    assert reason is not None and "unreachable" in reason


def test_pre_downloaded_pair_needs_no_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for part in ("target", "drafter"):
        (tmp_path / part).mkdir()
        (tmp_path / part / "config.json").write_text("{}")
    manifest = stage.stage_hub_pair("qwen3-8b", HUB_PAIR, tmp_path)
    assert manifest["models"]["drafter"]["repo"] == "z-lab/Qwen3-8B-DFlash-b16"
    assert json.loads((tmp_path / "manifest.json").read_text())["source"] == "hub"


def test_environment_record(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "manifest.json").write_text(json.dumps({"corpus": [{"file": "a.py", "sha256": "0" * 64}]}))
    env = envinfo.collect_environment(tmp_path, {"pair": tmp_path, "none": tmp_path / "missing"})
    assert env["packages"]["torch"] and env["packages"]["ddtree"]
    assert env["git"]["commit"] is None  # a repository without commits
    assert len(env["pairs"]["pair"]["corpus_sha256"]) == 64
    assert env["pairs"]["none"]["manifest_sha256"] is None
    (tmp_path / "manifest.json").write_text(json.dumps({"corpus": {"corpus_sha256": "ab" * 32}}))
    assert envinfo.manifest_hash(tmp_path)["corpus_sha256"] == "ab" * 32
    rows = envinfo.environment_rows(env)
    assert any(r["key"] == "packages.torch" for r in rows)


def test_offline_hub_dataset_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = {"source": "hub", "repo": "openai/gsm8k", "revision": "main", "file": "main/test.parquet",
            "text_field": "question"}
    with pytest.raises(stage.HubUnavailableError, match="dataset 'gsm8k' needs openai/gsm8k@main"):
        stage.stage_hub_dataset("gsm8k", spec, tmp_path)
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "test.parquet").write_bytes(b"x")
    assert stage.stage_hub_dataset("gsm8k", spec, tmp_path) == tmp_path / "main" / "test.parquet"
