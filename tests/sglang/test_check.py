"""`python -m ddtree.sglang.check` (GPU host only): the commands it starts and its verdict, with the two
servers replaced by recorded responses."""

from __future__ import annotations

import json

from ddtree.sglang import check


def fake_serve(tau: float, diverge: int | None = None):
    calls = []

    def serve(method, args, extra, log_dir, requests):
        calls.append((method, extra, [r["params"]["temperature"] for r in requests]))
        return [
            {"text": f"out{i}" + ("x" if method == "ddtree" and i == diverge else ""),
             "meta_info": {"completion_tokens": 128, **({"spec_accept_length": tau} if method == "ddtree" else {})}}
            for i, _ in enumerate(requests)
        ]

    return serve, calls


def test_check_reports_tau_and_greedy_matches(monkeypatch, tmp_path, capsys):
    serve, calls = fake_serve(5.5, diverge=2)
    monkeypatch.setattr(check, "_serve", serve)
    out = tmp_path / "check.json"
    status = check.main(["--model", "m", "--budget", "32", "--out", str(out), "--", "--tp-size", "8"])
    assert status == 0
    assert [c[0] for c in calls] == ["ar", "ddtree"] and all(c[1] == ["--tp-size", "8"] for c in calls)
    n = len(check.PROMPTS)
    assert calls[0][2] == [0.0] * n and calls[1][2] == [0.0] * n + [1.0] * n
    result = json.loads(out.read_text())
    assert result["ok"] is True and result["budget"] == 32
    assert [r["greedy_match"] for r in result["rows"]] == [i != 2 for i in range(n)]
    assert "mean greedy tau 5.50" in capsys.readouterr().out


def test_check_fails_when_the_tree_never_accepts(monkeypatch):
    serve, _ = fake_serve(1.0)
    monkeypatch.setattr(check, "_serve", serve)
    assert check.main(["--model", "m"]) == 1

