"""Run ids, cross-reference checks and benchmark plans."""

from __future__ import annotations

import copy
import json

import pytest

from ddtree.bench.schema import read_plan, write_plan
from ddtree.pipeline.config import (
    build_plan,
    check_hardware_profile,
    check_references,
    parse_run_id,
    plan_fingerprint,
    reset_stale_records,
    run_id,
    run_ids,
    server_extra_args,
)

CONFIG = {
    "hardware": ["cpu"],
    "pairs": ["embedded-small"],
    "datasets": ["stdlib-heldout"],
    "methods": ["ar", "dflash", "ddtree"],
    "budgets": [32, 8],
    "model_pairs": {"embedded-small": {"source": "embedded", "size": "small", "seed": 0}},
    "dataset_catalog": {"stdlib-heldout": {"source": "embedded"}},
    "variants": [
        {"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0},
        {"name": "t1", "temperature": 1.0, "top_k": -1, "top_p": 1.0},
    ],
    "acceptance": {"variants": ["greedy", "t1"], "num_prompts": 4, "max_new_tokens": 32, "samples_per_prompt": 2},
    "throughput": {"concurrency": [1, 2], "num_requests": 4, "max_new_tokens": 16, "variant": "greedy"},
}
PROFILE = {
    "engine": "reference", "device": "cpu", "dtype": "float32", "tensor_parallel_size": 1, "server_args": [],
    "health_timeout_s": 300, "resources": {"gpus": 0},
}


def test_run_ids_do_not_multiply_ar_and_dflash_by_budgets():
    assert run_ids(["ar", "dflash", "ddtree"], [32, 8, 8]) == ["ar", "dflash", "ddtree-b8", "ddtree-b32"]
    for run in run_ids(["ar", "dflash", "ddtree"], [4]):
        assert run_id(*parse_run_id(run)) == run


@pytest.mark.parametrize("bad", ["ar-b8", "ddtree", "eagle", "ddtree-b"])
def test_parse_run_id_rejects(bad):
    with pytest.raises(ValueError, match="run id"):
        parse_run_id(bad)


def test_run_id_rejects_missing_budget_and_unknown_method():
    with pytest.raises(ValueError, match="budget"):
        run_id("ddtree", None)
    with pytest.raises(ValueError, match="method"):
        run_id("eagle", None)


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("hardware",), ["gb200"], "hardware profile 'gb200' is unknown"),
        (("pairs",), ["nope"], "pairs: 'nope'"),
        (("datasets",), ["nope"], "datasets: 'nope'"),
        (("acceptance", "variants"), ["hot"], "acceptance.variants: 'hot'"),
        (("throughput", "variant"), "hot", "throughput.variant: 'hot'"),
    ],
)
def test_check_references_names_the_dangling_reference(path, value, message):
    config = copy.deepcopy(CONFIG)
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        check_references(config, ["cpu"])


def test_check_references_accepts_valid_config():
    check_references(CONFIG, ["cpu", "h200-x1"])


def test_hardware_profile_checks():
    check_hardware_profile("cpu", PROFILE)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        check_hardware_profile("cpu", {**PROFILE, "tensor_parallel_size": 2})
    gpu = {**PROFILE, "engine": "sglang", "device": "cuda", "tensor_parallel_size": 8, "resources": {"gpus": 4}}
    with pytest.raises(ValueError, match="resources.gpus"):
        check_hardware_profile("x", gpu)


def test_server_extra_args_adds_tp_once_for_sglang():
    sgl = {**PROFILE, "engine": "sglang", "tensor_parallel_size": 8, "server_args": ["--mem-fraction-static", 0.8]}
    assert server_extra_args(sgl) == ["--mem-fraction-static", "0.8", "--tp-size", "8"]
    assert server_extra_args(PROFILE) == []


def test_build_plan_matches_contract(tmp_path):
    typed = build_plan(CONFIG, "cpu", PROFILE, "embedded-small", "ddtree-b8", model_dir="m", prompts="p.jsonl",
                       num_prompts=4, out_dir=str(tmp_path), server_log="s.log")
    write_plan(tmp_path / "plan.json", typed)
    assert read_plan(tmp_path / "plan.json") == typed
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert set(plan) == {"server", "prompts", "acceptance", "throughput", "tags", "out", "schema_version"}
    assert plan["server"]["method"] == "ddtree" and plan["server"]["budget"] == 8
    assert plan["tags"] == {"profile": "cpu", "pair": "embedded-small", "method": "ddtree", "budget": 8,
                            "verifier": "exact"}
    assert [v["name"] for v in plan["acceptance"]["variants"]] == ["greedy", "t1"]
    assert plan["throughput"]["variant"]["temperature"] == 0.0
    assert plan["out"]["summary"] == str(tmp_path / "records" / "session.json")
    ar = build_plan(CONFIG, "cpu", PROFILE, "embedded-small", "ar", model_dir="m", prompts="p.jsonl",
                    num_prompts=4, out_dir=str(tmp_path), server_log="s.log")
    assert ar.tags["budget"] is None and isinstance(ar.server.budget, int)
    with pytest.raises(ValueError, match="num_prompts"):
        build_plan(CONFIG, "cpu", PROFILE, "p", "ar", model_dir="m", prompts="p", num_prompts=0, out_dir="o",
                   server_log="s")


def test_sglang_bench_serving_switch_adds_a_phase_on_the_throughput_requests(tmp_path):
    config = {**CONFIG, "throughput": {**CONFIG["throughput"], "sglang_bench_serving": True}}
    plan = build_plan(config, "cpu", PROFILE, "embedded-small", "ddtree-b8", model_dir="m", prompts="p.jsonl",
                      num_prompts=4, out_dir=str(tmp_path), server_log="s.log").to_json()
    assert plan["sglang_bench"] == {"concurrency": [1, 2], "num_prompts": 4, "output_len": 16,
                                    "variant": plan["throughput"]["variant"]}
    assert plan["out"]["sglang_bench"] == str(tmp_path / "records" / "sglang_bench.jsonl")
    off = build_plan(CONFIG, "cpu", PROFILE, "embedded-small", "ddtree-b8", model_dir="m", prompts="p.jsonl",
                     num_prompts=4, out_dir=str(tmp_path), server_log="s.log").to_json()
    assert "sglang_bench" not in off and "sglang_bench" not in off["out"]  # off unless asked for


def test_stale_records_are_reset_and_matching_ones_kept(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"seed": 0}')
    plan = build_plan(CONFIG, "cpu", PROFILE, "embedded-small", "ar", model_dir="m", prompts="p.jsonl",
                      num_prompts=4, out_dir=str(tmp_path / "run"), server_log="s.log")
    records = tmp_path / "run" / "records" / "acceptance.jsonl"
    fingerprint = plan_fingerprint(plan, manifest)
    assert reset_stale_records(plan, fingerprint) == []
    records.write_text('{"prompt_id": "0"}\n')
    assert reset_stale_records(plan, fingerprint) == [] and records.exists()  # same plan + model: resume
    manifest.write_text('{"seed": 1}')  # the pair was retrained
    assert reset_stale_records(plan, plan_fingerprint(plan, manifest)) == [str(records)]
    assert not records.exists()



def test_sglang_plans_give_each_method_its_server_arguments(tmp_path) -> None:
    """On an SGLang profile ar runs plain, dflash the built-in DFLASH, ddtree the plugin with N = budget + 1
    and running requests / decode graph batch sizes bounded for N tokens per request."""
    from ddtree.bench.session import server_command
    from ddtree.pipeline.config import sglang_check_command

    sglang = {**PROFILE, "engine": "sglang", "device": "cuda", "tensor_parallel_size": 8,
              "server_args": ["--attention-backend", "triton", "--mem-fraction-static", "0.85"]}
    (tmp_path / "m" / "target").mkdir(parents=True)
    (tmp_path / "m" / "drafter").mkdir()

    def command(run: str) -> list[str]:
        plan = build_plan(CONFIG, "b300-x8", sglang, "embedded-small", run, model_dir=str(tmp_path / "m"),
                          prompts="p.jsonl", num_prompts=4, out_dir=str(tmp_path / run), server_log="s.log")
        return server_command(plan.server, "127.0.0.1", 30000)

    def value(cmd: list[str], flag: str) -> str | None:
        return cmd[cmd.index(flag) + 1] if flag in cmd else None

    ar, dflash, ddtree = command("ar"), command("dflash"), command("ddtree-b256")
    assert "--speculative-algorithm" not in ar
    assert value(dflash, "--speculative-algorithm") == "DFLASH" and "--speculative-num-draft-tokens" not in dflash
    assert value(ddtree, "--speculative-algorithm") == "DDTREE"
    assert value(ddtree, "--speculative-draft-model-path") == str(tmp_path / "m" / "drafter")
    assert value(ddtree, "--speculative-num-draft-tokens") == "257"
    assert value(ddtree, "--max-running-requests") == value(ddtree, "--cuda-graph-max-bs-decode") == "15"
    for cmd in (ar, dflash, ddtree):
        assert value(cmd, "--tp-size") == "8" and value(cmd, "--attention-backend") == "triton"
    # a profile's own bound wins
    sglang["server_args"] = [*sglang["server_args"], "--max-running-requests", "4"]
    bounded = command("ddtree-b64")
    assert bounded.count("--max-running-requests") == 1 and value(bounded, "--cuda-graph-max-bs-decode") == "4"
    check = sglang_check_command(sglang, "resources/models/qwen3-8b", 64)
    assert check.startswith("python -m ddtree.sglang.check --model resources/models/qwen3-8b --budget 64 -- ")
    assert "--tp-size 8" in check


def test_profile_pairs_apply_the_profiles_replacements():
    from ddtree.pipeline.config import profile_pairs

    pairs = {"embedded-small": {}, "embedded-gpu": {}, "qwen3-8b": {}}
    gpu = {**PROFILE, "replace_pairs": {"embedded-small": "embedded-gpu"}}
    assert profile_pairs(["embedded-small", "qwen3-8b"], "h", gpu, pairs) == ["embedded-gpu", "qwen3-8b"]
    assert profile_pairs(["embedded-small", "embedded-gpu"], "h", gpu, pairs) == ["embedded-gpu"]
    assert profile_pairs(["embedded-small"], "cpu", PROFILE, pairs) == ["embedded-small"]
    with pytest.raises(ValueError, match="'nope' is not defined under 'model_pairs'"):
        profile_pairs(["embedded-small"], "h", {**PROFILE, "replace_pairs": {"embedded-small": "nope"}}, pairs)


def test_train_profile_defaults_to_cpu_and_must_exist():
    from ddtree.pipeline.config import train_profile

    assert train_profile("p", {"source": "embedded"}, ["cpu"]) == "cpu"
    assert train_profile("p", {"train_profile": "h200-x1"}, ["cpu", "h200-x1"]) == "h200-x1"
    with pytest.raises(ValueError, match="train_profile 'gb200' is unknown"):
        train_profile("p", {"train_profile": "gb200"}, ["cpu"])
