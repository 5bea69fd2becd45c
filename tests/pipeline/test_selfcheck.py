"""`ddtree selfcheck` on CPU: every check passes and the JSON record has the documented fields."""

from __future__ import annotations

import json

from ddtree.cli import main


def test_selfcheck_cpu_writes_a_passing_record(tmp_path):
    out = tmp_path / "sub" / "check.json"
    rc = main(["selfcheck", "--device", "cpu", "--out", str(out), "--rows", "3000"])
    record = json.loads(out.read_text())
    failed = [c for c in record["checks"] if not c["ok"]]
    assert rc == 0 and record["ok"] is True, failed
    assert record["device"] == "cpu"
    assert record["sglang_kernel"] in ("available", "unavailable")
    assert {"torch_version", "cuda", "checks"} <= set(record)
    names = {c["name"] for c in record["checks"]}
    assert {"build_heap_equals_batched", "retrieve_walk", "verify_greedy_walk",
            "verify_sampling_lossless[torch]", "verify_sampling_lossless[reference]",
            "temperature_zero_equals_greedy"} <= names
    for check in record["checks"]:
        assert set(check) == {"name", "ok", "detail", "seconds"} and check["seconds"] >= 0


def test_selfcheck_unknown_device_fails_with_nonzero_exit(tmp_path):
    out = tmp_path / "check.json"
    rc = main(["selfcheck", "--device", "tpu", "--out", str(out)])
    record = json.loads(out.read_text())
    assert rc == 1 and record["ok"] is False
    assert record["checks"][0]["name"] == "device" and not record["checks"][0]["ok"]
