"""The whole workflow on the tiny test configuration (.test/config.yaml), for real: the tiny pair
is trained, servers are started, records aggregated and reports rendered. Then a benchmark is
killed mid-run: no server may survive, and the rerun must resume instead of redoing requests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from workflow_helpers import copy_workflow, snakemake

pytestmark = pytest.mark.slow

TEST_CONFIG = (".test/config.yaml",)
SERVER_MARK = "ddtree.cli serve"


def live_processes(workdir: Path, mark: str = SERVER_MARK) -> list[str]:
    """Command lines of live processes (default: reference servers) whose cwd is under workdir."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
            state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if mark in cmd and cwd.startswith(str(workdir)) and "zombie" not in state:
            found.append(cmd)
    return found


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    workdir = copy_workflow(tmp_path_factory.mktemp("e2e") / "wf")
    done = snakemake(workdir, "--cores", "2", "--configfile", *TEST_CONFIG, timeout=1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return workdir


def test_end_to_end_outputs(finished_run: Path):
    wd = finished_run
    for report in ("cpu", "summary"):
        html = (wd / "results" / "reports" / f"{report}.html").read_text()
        assert len(html) > 10_000 and "<html" in html.lower()
        assert "data:image/png;base64" in html  # the seaborn figures are embedded
    tables = wd / "results" / "tables"
    acceptance = pd.read_parquet(tables / "acceptance.parquet")
    assert set(acceptance["method"]) == {"ar", "dflash", "ddtree"}
    assert acceptance["error"].isna().all()
    # 3 prompts: greedy once, t1 twice per prompt -> 9 requests per run; the power panel's lossy run: t1 only.
    exact = acceptance[acceptance["verifier"] == "exact"]
    assert (exact.groupby("method").size() == 9).all()
    lossy = acceptance[acceptance["verifier"] == "greedy_accept"]
    assert len(lossy) == 6 and set(lossy["variant"]) == {"t1"} and set(lossy["budget"]) == {4}
    ztest = pd.read_parquet(tables / "acceptance_test.parquet")
    assert {"exact", "greedy_accept"} <= set(ztest["verifier"])
    assert ztest["detectable_bias"].notna().all()
    html = (wd / "results" / "reports" / "cpu.html").read_text()
    assert "Conclusions" in html and "Power panel" in html
    assert set(pd.read_csv(tables / "throughput.csv")["concurrency"]) == {1, 2}
    match = pd.read_parquet(tables / "greedy_match.parquet")
    assert set(match["method"]) == {"dflash", "ddtree"} and (match["n"] == 3).all()
    assert not pd.read_parquet(tables / "sampling_test.parquet").empty
    env = json.loads((tables / "environment.json").read_text())
    assert env["packages"]["torch"] and env["pairs"]["embedded-tiny"]["manifest_sha256"]
    assert json.loads((wd / "results/cpu/build/selfcheck.json").read_text())["ok"] is True
    plan = json.loads((wd / "results/cpu/embedded-tiny/ddtree-b4/plan.json").read_text())
    # .test/config.yaml leaves top_k/top_p out: the schema's defaults were filled in.
    assert [(v["top_k"], v["top_p"]) for v in plan["acceptance"]["variants"]] == [(-1, 1.0), (-1, 1.0)]
    assert plan["tags"] == {"profile": "cpu", "pair": "embedded-tiny", "method": "ddtree", "budget": 4,
                            "verifier": "exact"}
    assert plan["acceptance"]["seed_salt"] == "ddtree-b4"
    assert live_processes(wd) == []
    # A second run has nothing to do.
    again = snakemake(wd, "-n", "--cores", "1", "--configfile", *TEST_CONFIG)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_killed_benchmark_leaves_no_server_and_rerun_resumes(finished_run: Path):
    wd = finished_run
    run_dir = wd / "results" / "cpu" / "embedded-tiny" / "ar"
    records = run_dir / "records" / "acceptance.jsonl"
    # More requests than the finished run, so the benchmark is still busy when it is killed.
    (wd / "more.yaml").write_text(
        "acceptance: {variants: [greedy, t1], num_prompts: 3, max_new_tokens: 48, samples_per_prompt: 12}\n"
    )
    more = ["more.yaml"]  # a second --configfile, layered over the test config
    target = str(run_dir.relative_to(wd) / "summary.json")
    cmd = [sys.executable, "-m", "snakemake", target, "--cores", "2", "--configfile", *TEST_CONFIG, *more]
    proc = subprocess.Popen(cmd, cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            lines = records.read_text().splitlines() if records.exists() else []
            # sample_index 2 exists only in the new plan's records (the first run drew 2 samples).
            if any(json.loads(line).get("sample_index", 0) >= 2 for line in lines[:-1]):
                assert live_processes(wd), "the running server is not visible to the process check"
                break
            assert proc.poll() is None, "the benchmark finished before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no records appeared within 300 s")
        os.killpg(proc.pid, signal.SIGTERM)  # what a cluster scheduler or Ctrl-C does to the job
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    # The session may still be stopping its server when Snakemake exits: give it its grace period.
    plan = str(run_dir.relative_to(wd) / "plan.json")
    deadline = time.monotonic() + 60
    while live_processes(wd, mark=f"bench session --plan {plan}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_processes(wd, mark=f"bench session --plan {plan}") == []
    assert live_processes(wd) == [], "a server outlived the killed benchmark"
    assert not (run_dir / "summary.json").exists()  # an interrupted run never looks finished
    session = json.loads((run_dir / "records" / "session.json").read_text())
    assert session["status"] in ("interrupted", "failed")

    before = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    assert 3 <= len(before) < 3 + 3 * 12
    done = snakemake(wd, target, "--cores", "2", "--configfile", *TEST_CONFIG, *more, "--rerun-incomplete",
                     timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    after = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    assert len(after) == 3 + 3 * 12
    # Finished requests were kept as they were, not redone.
    assert after[: len(before)] == before
    keys = [(r["prompt_id"], r["variant"], r["sample_index"]) for r in after]
    assert len(set(keys)) == len(keys)
