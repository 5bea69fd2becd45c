"""First check of the DDTREE plugin on an SGLang GPU host: one command, a short table, exit status.

    python -m ddtree.sglang.check --model resources/models/<pair> --budget 64 [--out check.json] \
        -- --tp-size 8 --attention-backend triton --mem-fraction-static 0.85 --disable-overlap-schedule

Starts SGLang twice on loopback with the same extra arguments: plain decoding, then DDTREE (through the
installed plugin, in every SGLang process). Sends the same prompts greedy to both and sampled (T = 1) to
DDTREE, and reports per prompt whether the greedy outputs match (bf16 near-ties can flip a token between
a tree verify and a plain decode, so a rare mismatch is expected; many mean a broken verify) and the mean
accepted tokens per round (`meta_info.spec_accept_length`, the bonus included). It fails (status 1) when
the DDTREE server does not start, a request fails, or greedy acceptance stays at 1 token per round
(a tree that never accepts means the drafter context or the tree mask is not reaching the target).
`--model` takes a pair directory (target/ and drafter/) or a target path with
`--speculative-draft-model-path` among the extra arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from ddtree.engine.types import DEFAULT_MAX_NEW_TOKENS

PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colours of light are",
    "Question: A train travels 60 km in 45 minutes. What is its speed in km/h?\nAnswer:",
    "import numpy as np\n\n# Compute the mean of each column of a 2-D array\ndef column_means(a):\n",
)


def _generate(url: str, prompt: str, params: dict[str, Any]) -> dict[str, Any]:
    with httpx.Client(timeout=600.0, trust_env=False) as client:
        response = client.post(f"{url}/generate", json={"text": prompt, "sampling_params": params})
        response.raise_for_status()
        return response.json()


def _serve(method: str, args: argparse.Namespace, extra: list[str], log_dir: Path, requests: list[dict]) -> list[dict]:
    """Start SGLang for `method`, run `requests` ({prompt, params}), stop it; the responses in order."""
    from ddtree.bench.http_client import wait_for_health
    from ddtree.bench.schema import ServerSpec
    from ddtree.bench.session import free_port, server_command, start_server, stop_server

    port = free_port()
    server = ServerSpec(engine="sglang", model=args.model, method=method, budget=args.budget, device="cuda",
                        extra_args=tuple(extra))
    cmd = server_command(server, "127.0.0.1", port)
    print(f"[{method}] {' '.join(cmd)}", flush=True)
    log_path = log_dir / f"{method}.log"
    proc = start_server(cmd, log_path, port=port)
    try:
        wait_for_health(proc.url, args.health_timeout_s, process=proc.process, log_path=log_path)
        return [_generate(proc.url, r["prompt"], r["params"]) for r in requests]
    finally:
        stop_server(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree.sglang.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="pair directory (target/, drafter/) or target path")
    parser.add_argument("--budget", type=int, default=64, help="DDTree node budget (N = budget + 1)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--health-timeout-s", type=float, default=2400.0)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then SGLang server arguments for both servers")
    args = parser.parse_args(argv)
    extra = [a for a in args.extra if a != "--"]

    greedy = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    sampled = {"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "sampling_seed": 0}
    with tempfile.TemporaryDirectory(prefix="ddtree-sglang-check-") as tmp:
        logs = Path(args.out).parent if args.out else Path(tmp)
        plain = _serve("ar", args, extra, logs, [{"prompt": p, "params": greedy} for p in PROMPTS])
        tree = _serve("ddtree", args, extra, logs,
                      [{"prompt": p, "params": greedy} for p in PROMPTS]
                      + [{"prompt": p, "params": sampled} for p in PROMPTS])

    rows = []
    for i, prompt in enumerate(PROMPTS):
        g, s = tree[i], tree[len(PROMPTS) + i]
        rows.append({
            "prompt": i,
            "greedy_match": g["text"] == plain[i]["text"],
            "tau_greedy": float(g["meta_info"].get("spec_accept_length", 1.0)),
            "tau_t1": float(s["meta_info"].get("spec_accept_length", 1.0)),
            "tokens_greedy": int(g["meta_info"]["completion_tokens"]),
        })
    print(f"{'prompt':>6} {'greedy = plain':>15} {'tau greedy':>11} {'tau T=1':>8} {'tokens':>7}")
    for r in rows:
        print(f"{r['prompt']:>6} {str(r['greedy_match']):>15} {r['tau_greedy']:>11.2f} {r['tau_t1']:>8.2f} "
              f"{r['tokens_greedy']:>7}")
    mean_tau = sum(r["tau_greedy"] for r in rows) / len(rows)
    ok = mean_tau > 1.0
    print(f"mean greedy tau {mean_tau:.2f}; greedy matches {sum(r['greedy_match'] for r in rows)}/{len(rows)}; "
          f"{'OK' if ok else 'FAIL: greedy acceptance stays at one token per round'}")
    if args.out:
        Path(args.out).write_text(json.dumps({"budget": args.budget, "rows": rows, "ok": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
