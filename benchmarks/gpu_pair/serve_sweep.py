"""Throughput against concurrency through the reference server: `ar`, `dflash` and `ddtree` at each budget
(issue 12: 8 concurrent requests, and the sweep over 1, 2, 4, 8, 16 with the best budget per level).

One server per method (`ddtree serve`, continuous batching up to --max-batch, CUDA graphs of every batch
bucket and every swept budget captured at start); the ddtree budgets go to one server as per-request
overrides. Each level sends max(--min-requests, 2 x concurrency) requests of --max-new-tokens tokens
(EOS ignored, so every request decodes the same length) after one untimed warm-up level. Writes
$OUT/sweep_records.jsonl (one record per request, `ddtree bench throughput`'s), $OUT/sweep.json and
$OUT/sweep.txt: output tokens/s per (method, budget, T, concurrency), the best ddtree budget per level and
the ratios over dflash and ar.

    python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair            # one H200
    python3 benchmarks/gpu_pair/serve_sweep.py --pair PAIR --device cpu --dtype float32 --concurrency 1,2 \\
        --budgets 8 --max-new-tokens 16 --min-requests 2                       # a CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ddtree.bench.http_client import wait_for_health
from ddtree.bench.session import free_port, start_server, stop_server
from ddtree.bench.throughput import run_throughput


def variant(temperature: float) -> dict[str, Any]:
    return {"name": "greedy" if temperature == 0 else f"t{temperature:g}", "temperature": temperature,
            "top_k": -1, "top_p": 1.0}


def sweep_server(args: argparse.Namespace, method: str, budgets: list[int | None], out: Path,
                 rows: list[dict[str, Any]]) -> None:
    port = free_port()
    top = max((b for b in budgets if b is not None), default=1)
    cmd = [sys.executable, "-m", "ddtree.cli", "serve", "--model", args.pair, "--method", method,
           "--budget", str(top), "--max-budget", str(top), "--max-batch", str(args.max_batch),
           "--max-seq-len", str(args.max_seq_len), "--device", args.device, "--dtype", args.dtype,
           "--port", str(port), "--log-level", "warning"]
    if method == "ddtree":
        cmd += ["--warmup-budgets", ",".join(str(b) for b in budgets)]
    t0 = time.perf_counter()
    server = start_server(cmd, out / f"server_{method}.log", port=port)
    try:
        wait_for_health(server.url, args.health_timeout_s, process=server.process, log_path=server.log_path)
        print(f"{method} server ready in {time.perf_counter() - t0:.1f} s", flush=True)
        levels = [int(c) for c in args.concurrency.split(",")]
        for temperature in [float(t) for t in args.temperatures.split(",")]:
            for budget in budgets:
                tags = {"method": method, "budget": budget or 0, "temperature": temperature}
                run_throughput(server.url, args.prompts, concurrency=[max(levels)], num_requests=max(levels),
                               max_new_tokens=args.max_new_tokens, variant=variant(temperature),
                               tags={**tags, "warmup": True}, out=out / "warmup.jsonl", budget=budget)
                for level in levels:
                    n = max(args.min_requests, 2 * level)
                    result = run_throughput(server.url, args.prompts, concurrency=[level], num_requests=n,
                                            max_new_tokens=args.max_new_tokens, variant=variant(temperature),
                                            tags=tags, out=out / "sweep_records.jsonl", budget=budget)
                    s = result["levels"][level]
                    row = {**tags, "concurrency": level, **{k: s[k] for k in (
                        "requests", "errors", "output_tokens", "duration_s", "output_tokens_per_s", "mean_tpot",
                        "mean_ttft")}}
                    rows.append(row)
                    print(f"  {method:<6} budget {budget or '-':>4} T={temperature:g} c={level:>2}: "
                          f"{row['output_tokens_per_s'] or 0:9.1f} tok/s, TPOT "
                          f"{1e3 * (row['mean_tpot'] or 0):7.2f} ms, errors {row['errors']}", flush=True)
                    (out / "sweep.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    finally:
        stop_server(server)


def summary_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'T':>4} {'conc':>5} {'ar tok/s':>9} {'dflash':>9} {'best ddtree':>12} {'budget':>7} "
             f"{'/dflash':>8} {'/ar':>6}   ddtree tok/s per budget"]
    keys = sorted({(r["temperature"], r["concurrency"]) for r in rows})
    for temperature, level in keys:
        at = [r for r in rows if r["temperature"] == temperature and r["concurrency"] == level]
        rate = lambda m: next((r["output_tokens_per_s"] for r in at if r["method"] == m), None)  # noqa: E731
        trees = sorted((r for r in at if r["method"] == "ddtree"), key=lambda r: r["budget"])
        best = max(trees, key=lambda r: r["output_tokens_per_s"] or 0, default=None)
        ar, dflash = rate("ar"), rate("dflash")
        b_rate = best["output_tokens_per_s"] if best else None
        fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"  # noqa: E731
        per = " ".join(f"{r['budget']}:{fmt(r['output_tokens_per_s'])}" for r in trees)
        lines.append(f"{temperature:>4g} {level:>5} {fmt(ar):>9} {fmt(dflash):>9} {fmt(b_rate):>12} "
                     f"{best['budget'] if best else '-':>7} {ratio(b_rate, dflash):>8} {ratio(b_rate, ar):>6}   {per}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", required=True)
    ap.add_argument("--prompts", default=None, help="default PAIR/prompts/heldout.jsonl")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--budgets", default="16,32,64,128")
    ap.add_argument("--temperatures", default="0")
    ap.add_argument("--methods", default="ar,dflash,ddtree")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--health-timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    args.prompts = args.prompts or str(Path(args.pair) / "prompts" / "heldout.jsonl")
    out = Path(os.environ.get("OUT") or "results/serve_sweep")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    budgets = [int(b) for b in args.budgets.split(",")]
    for method in args.methods.split(","):
        sweep_server(args, method, budgets if method == "ddtree" else [None], out, rows)
    text = summary_table(rows)
    (out / "sweep.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
