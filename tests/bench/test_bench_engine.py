"""`ddtree bench engine` end to end on the untrained tiny pair (tiny settings), plus its pure helpers."""

from __future__ import annotations

import argparse
import json

import pytest

from ddtree.bench import engine_bench
from ddtree.engine.types import STAGES, GenerationOutput


def _output(ids, accept_lens, decode_time, expected=None):
    return GenerationOutput(
        output_ids=ids, finish_reason="length", rounds=len(accept_lens), accept_lens=accept_lens,
        expected_accept_lens=expected if expected is not None else [float(a) for a in accept_lens],
        stage_times=dict.fromkeys(STAGES, 0.01),
        ttft=0.1, decode_time=decode_time,
    )


def test_summarize_pools_rounds_and_averages_tpot_per_response():
    a = _output([1, 2, 3, 4, 5], [1, 2], decode_time=0.4)  # 4 decode tokens -> 0.1 s/token
    b = _output([1, 2, 3], [0, 0, 1], decode_time=0.6, expected=[0.5, 0.5, 1.0])  # 0.3 s/token
    row = engine_bench.summarize([a, b], ar_outputs=[a, _output([1, 2, 9], [0], 0.1)])
    assert row["tau"] == pytest.approx((3 + 2 + 4) / 5)  # (sum accept + rounds) / rounds, pooled
    assert row["expected_tau"] == pytest.approx((3 + 2 + 2 + 3) / 5)
    assert row["tpot_ms"] == pytest.approx(1e3 * (0.1 + 0.3) / 2)
    assert row["stage_ms"]["verify"] == pytest.approx(1e3 * 0.02 / 5)
    assert row["match_ar"] == 0.5


def test_parse_list_and_configurations():
    assert engine_bench.parse_list("8, 16", int, "--budgets") == [8, 16]
    with pytest.raises(ValueError, match="--budgets"):
        engine_bench.parse_list("8,x", int, "--budgets")
    configs = engine_bench.configurations(["ddtree", "ar", "dflash"], [4, 8])
    assert configs == [("ar", None), ("dflash", None), ("ddtree", 4), ("ddtree", 8)]


def test_bench_engine_runs_and_writes_json(untrained_pair, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    engine_bench.add_arguments(parser)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "text": f"def f{i}(x):\n    return x"}) for i in range(2)))
    out = tmp_path / "bench.json"
    args = parser.parse_args([
        "--model", str(untrained_pair), "--prompts", str(prompts), "--num-prompts", "2",
        "--max-new-tokens", "6", "--budgets", "2,4", "--temperatures", "0,1", "--device", "cpu",
        "--no-progress", "--json-out", str(out),
    ])
    assert engine_bench.run(args) == 0
    table = capsys.readouterr().out
    assert "speedup" in table and "ddtree" in table and "dflash" in table
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert len(rows) == 2 * 4  # 2 temperatures x (ar, dflash, ddtree@2, ddtree@4)
    greedy = [r for r in rows if r["temperature"] == 0]
    assert all(r["match_ar"] == 1.0 for r in greedy)  # float32 on CPU: token-identical to ar
    assert all(r["tau"] >= 1.0 for r in rows)
    assert [r["speedup"] for r in rows if r["method"] == "ar"] == [1.0, 1.0]
    assert len(payload["records"]) == 2 * 2 * 4
    # stage times are on by default on the CPU: every speculative round has a positive draft and verify time
    assert payload["stage_times"] is True
    assert all(r["stage_ms"]["draft"] > 0 and r["stage_ms"]["verify"] > 0 for r in rows if r["method"] != "ar")

    # off: the stage columns say "-" rather than a misleading 0.000
    args.stage_times, args.json_out, args.temperatures = "off", None, "0"
    assert engine_bench.run(args) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("ddtree")]
    assert lines and all(line[7:12] == ["-"] * 5 for line in lines)  # draft .. commit


def test_cost_model_runs_every_cell_on_cpu(tmp_path):
    """`--random-weights` end to end on the CPU with the test shape: every (batch, method) cell timed, its stages
    and its floor recorded (values are machine-dependent: only their presence and sign are checked)."""
    from ddtree.cli import main

    out = tmp_path / "cost.json"
    assert main(["bench", "engine", "--random-weights", "test-tiny", "--device", "cpu", "--rounds", "2",
                 "--budgets", "4", "--batch-sizes", "1,2", "--prompt-tokens", "16", "--profile-kernels", "2",
                 "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["batch"], r["method"]) for r in rows} == {(b, m) for b in (1, 2) for m in ("ar", "dflash", "ddtree")}
    for r in rows:
        assert r["round_ms"] > 0 and r["floor_ms"] > 0 and set(r["stage_ms"]) == set(STAGES)
        assert r["kernels"] and r["kernels"][0]["name"].startswith("(all ")
        assert 0 <= r["walk_ms"] <= r["stage_ms"]["verify"] and 0 < r["own_work_share"] < 1


def test_gpu_pair_shape_is_the_gpu_preset():
    from ddtree.bench.cost_model import SHAPES
    from ddtree.models.sizes import get_size

    shape, drafter = SHAPES["gpu-pair"]
    size = get_size("gpu")
    assert (shape.num_layers, shape.hidden_size, shape.intermediate_size, shape.vocab_size) == (
        size.target_layers, size.hidden_size, size.target_intermediate, size.vocab_size)
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim) == (size.num_heads, size.num_kv_heads, size.head_dim)
    assert drafter == {"layers": size.drafter_layers, "block_size": size.block_size,
                       "target_layer_ids": list(size.target_layer_ids)}
