"""The CPU engine, old vs new, as interleaved pairs (issue 12: "CPU: nothing slower than today on the default pair").

Two long-lived worker processes, one per source tree (`PYTHONPATH=<tree>/src`), each with its engine loaded once
(`make_engine` where the tree has it, else the Hugging Face `DecodingEngine`), decode one held-out prompt of the
pair at a time, alternately (old-new, then new-old), so the shared VM's drift, which moved one engine's speed by
up to 1.7x between the passes of `cpu_old_vs_new.sh`, hits both sides of a pair alike. A pair's ratio is new / old
time per output token, from the thread's CPU time (prefill included: the VM's steal time does not count); each cell
reports the median ratio and its quartiles.

    OLD=$(mktemp -d); git archive <rev> src | tar -x -C $OLD
    python benchmarks/engine/cpu_ab.py --old $OLD/src --new src --cells ar:1:0,dflash:1:0,ddtree:16:0 --pairs 24
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from ddtree.engine import GenerationRequest
from ddtree.models.pair import load_pair
pair_dir, max_new_tokens = sys.argv[1], int(sys.argv[2])
pair = load_pair(pair_dir)
try:
    from ddtree.engine import make_engine
    engine = make_engine(pair, method="ddtree", budget=16, device="cpu")
except ImportError:  # trees from before the batched engine
    from ddtree.engine.engine import DecodingEngine
    engine = DecodingEngine(pair, method="ddtree", budget=16, device="cpu", dtype=torch.float32)
with open(pair_dir + "/prompts/heldout.jsonl") as f:
    prompts = [pair.tokenizer.encode(json.loads(line)["text"])[-256:] for line in f]
print("ready", flush=True)
for line in sys.stdin:
    method, budget, temperature, index = line.split()
    request = GenerationRequest(input_ids=prompts[int(index) % len(prompts)], max_new_tokens=max_new_tokens,
                                temperature=float(temperature), seed=int(index))
    t = time.thread_time()
    out = engine.generate(request, method=method, budget=int(budget))
    ms = 1e3 * (time.thread_time() - t) / len(out.output_ids)
    print(json.dumps({"ms": ms, "tau": sum(out.accept_lens) / max(1, len(out.accept_lens)) + 1}), flush=True)
"""


class Worker:
    def __init__(self, src: str, pair: str, max_new_tokens: int) -> None:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, pair, str(max_new_tokens)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the worker for {src} did not start")

    def run(self, method: str, budget: str, temperature: str, index: int) -> dict[str, float]:
        self.proc.stdin.write(f"{method} {budget} {temperature} {index}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the old tree's src/ directory")
    ap.add_argument("--new", default="src", help="the new tree's src/ directory (default: this checkout's)")
    ap.add_argument("--pair", default="src/ddtree/models/embedded/small-seed0")
    ap.add_argument("--cells", default="ar:1:0,dflash:1:0,ddtree:16:0,ar:1:1,dflash:1:1,ddtree:16:1",
                    help="method:budget:temperature, comma-separated")
    ap.add_argument("--pairs", type=int, default=24, help="interleaved old/new pairs per cell")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    old, new = (Worker(src, args.pair, args.max_new_tokens) for src in (args.old, args.new))
    rows = []
    print(f"{'method':>6} {'budget':>6} {'T':>3} {'old ms/tok':>10} {'new ms/tok':>10} {'new/old':>8} "
          f"{'quartiles':>13} {'old tau':>7} {'new tau':>7}", flush=True)
    for cell in args.cells.split(","):
        method, budget, temperature = cell.split(":")
        for worker in (old, new):  # warm-up
            worker.run(method, budget, temperature, 0)
        got: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for index in range(args.pairs):
            order = (("old", old), ("new", new)) if index % 2 == 0 else (("new", new), ("old", old))
            for name, worker in order:
                got[name].append(worker.run(method, budget, temperature, index))
        ratios = [n["ms"] / o["ms"] for n, o in zip(got["new"], got["old"])]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        row = {"method": method, "budget": int(budget), "temperature": float(temperature), "pairs": args.pairs,
               "old_ms": statistics.median(r["ms"] for r in got["old"]),
               "new_ms": statistics.median(r["ms"] for r in got["new"]),
               "ratio": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3,
               "old_tau": statistics.mean(r["tau"] for r in got["old"]),
               "new_tau": statistics.mean(r["tau"] for r in got["new"])}
        rows.append(row)
        print(f"{method:>6} {budget:>6} {temperature:>3} {row['old_ms']:>10.3f} {row['new_ms']:>10.3f} "
              f"{row['ratio']:>7.3f}x {q1:>6.3f}-{q3:<6.3f} {row['old_tau']:>7.2f} {row['new_tau']:>7.2f}", flush=True)
    for worker in (old, new):
        worker.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
