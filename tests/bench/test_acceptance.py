"""`ddtree bench acceptance` against the real reference server on the tiny pair."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree.bench.acceptance import RECORD_FIELDS, run_acceptance
from ddtree.bench.http_client import derive_seed
from ddtree.bench.records import record_key
from ddtree.bench.session import ServerProcess
from ddtree.cli import main as ddtree_main

TAGS = {"pair": "tiny", "method": "ddtree", "budget": 16}
VARIANTS = [
    {"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0},
    {"name": "t1", "temperature": 1.0, "top_k": -1, "top_p": 0.95},
]
KEYS = [*TAGS, "prompt_id", "variant", "sample_index"]


@pytest.fixture(scope="module")
def server(tiny_pair: Path, tmp_path_factory, reference_server) -> Iterator[ServerProcess]:
    with reference_server(tiny_pair, "ddtree", tmp_path_factory.mktemp("acc_server") / "server.log") as srv:
        yield srv


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def acceptance(server: ServerProcess, prompts: Path, out: Path, **overrides) -> dict:
    kwargs = dict(num_prompts=2, max_new_tokens=8, samples_per_prompt=2, tags=TAGS, out=out)
    kwargs.update(overrides)
    return run_acceptance(server.url, prompts, VARIANTS, **kwargs)


def test_records_then_resume(server: ServerProcess, prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "acc.jsonl"
    summary = acceptance(server, prompts, out)
    # 2 prompts x (1 greedy sample + 2 sampled ones)
    assert (summary["planned"], summary["written"], summary["skipped"], summary["errors"]) == (6, 6, 0, 0)
    records = read(out)
    assert len(records) == 6
    for r in records:
        assert set(r) == set(TAGS) | set(RECORD_FIELDS)
        assert {k: r[k] for k in TAGS} == TAGS and r["error"] is None
        assert r["tau"] == pytest.approx(r["completion_tokens"] / r["spec_verify_ct"])
        assert len(r["accept_lens"]) == len(r["expected_accept_lens"]) == r["spec_verify_ct"]
        assert 1 <= r["completion_tokens"] == len(r["output_ids"]) <= 8
        assert r["seed"] == derive_seed(r["prompt_id"], r["variant"], r["sample_index"])
        assert r["dataset"] == "stdlib-heldout" and r["ttft"] > 0 and r["e2e_latency"] >= r["ttft"]
        assert set(r["stage_times"]) == {"draft", "tree_build", "tree_compile", "verify", "commit"}
    assert sorted((r["variant"], r["sample_index"]) for r in records) == sorted(
        [("greedy", 0)] * 2 + [("t1", 0), ("t1", 1)] * 2)
    assert summary["variants"]["greedy"]["requests"] == 2 and summary["variants"]["greedy"]["mean_tau"] >= 1.0

    # a rerun finds everything done
    again = acceptance(server, prompts, out)
    assert (again["written"], again["skipped"]) == (0, 6)
    assert read(out) == records
    assert again["variants"] == summary["variants"]  # summary still covers the stored records

    # a crash after 4 records, the 5th torn: the rerun redoes only the missing two
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:4]) + lines[4][:20])
    resumed = acceptance(server, prompts, out)
    assert (resumed["written"], resumed["skipped"]) == (2, 4)
    final = read(out)
    assert len({record_key(r, KEYS) for r in final}) == len(final) == 6
    # the redone requests carry the same seeds, so the same outputs
    by_key = {record_key(r, KEYS): r["output_ids"] for r in records}
    assert all(by_key[record_key(r, KEYS)] == r["output_ids"] for r in final)


def test_failed_requests_are_recorded_and_retried(server: ServerProcess, prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "acc.jsonl"
    summary = acceptance(server, prompts, out, num_prompts=1, max_new_tokens=5000)  # beyond the context
    assert summary["errors"] == summary["written"] == 3
    records = read(out)
    assert all("HTTP 400" in r["error"] and "max_new_tokens" in r["error"] for r in records)
    assert all(r["tau"] is None and r["output_ids"] is None for r in records)
    fixed = acceptance(server, prompts, out, num_prompts=1, max_new_tokens=4)
    assert (fixed["written"], fixed["skipped"], fixed["errors"]) == (3, 0, 0)
    assert len(read(out)) == 3 and all(r["error"] is None for r in read(out))


def test_cli(server: ServerProcess, prompts: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "acc.jsonl"
    argv = ["bench", "acceptance", "--url", server.url, "--prompts", str(prompts), "--variants",
            json.dumps(VARIANTS[:1]), "--num-prompts", "1", "--max-new-tokens", "4", "--tags",
            json.dumps({"run": "cli"}), "--out", str(out)]
    assert ddtree_main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 written, 0 skipped" in printed and "greedy" in printed
    assert ddtree_main(argv) == 0
    assert "0 written, 1 skipped" in capsys.readouterr().out
    assert [r["run"] for r in read(out)] == ["cli"]
    # every request refused (beyond the context): nothing was measured, the command fails
    failing = [*argv[:-2], "--out", str(tmp_path / "bad.jsonl")]
    failing[failing.index("--max-new-tokens") + 1] = "5000"
    assert ddtree_main(failing) == 1


def test_a_record_file_of_another_schema_version_is_not_extended(prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "acc.jsonl"
    old = {**TAGS, **dict.fromkeys(RECORD_FIELDS), "prompt_id": "p0", "dataset": "d", "variant": "greedy",
           "sample_index": 0, "seed": 1, "schema_version": 0}
    out.write_text(json.dumps(old) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{out} record 1: `schema_version`: this code reads version 1")):
        run_acceptance("http://127.0.0.1:9", prompts, VARIANTS, num_prompts=1, max_new_tokens=2, tags=TAGS, out=out)
    assert read(out) == [old]
