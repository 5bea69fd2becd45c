"""Re-run one (method, budget, variant) cell of the report's acceptance z-test with many more samples, in process.

A lossless verifier has E[accepted - expected | past] = 0 every round, so a z-test rejection that is chance
fades (|z| stays O(1)) when the sample grows, while a real bias grows like sqrt(rounds). This script decodes
`--num-prompts x --samples` independent seeded requests through the batched engine and prints the z-test of
observed vs exact expected accepted drafts (ddtree.pipeline.lossless.acceptance_z_test), overall and per block
of requests, so a reader sees whether |z| drifts with n.

    PYTHONPATH=src python benchmarks/acceptance_ztest_probe.py --model src/ddtree/models/embedded/small-seed0 \\
        --budget 4 --temperature 1 --top-k 20 --num-prompts 8 --samples 64 --max-new-tokens 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ddtree.bench.http_client import derive_seed, load_prompts
from ddtree.engine.batched import make_engine
from ddtree.engine.types import GenerationRequest
from ddtree.models.pair import load_pair
from ddtree.pipeline.lossless import acceptance_z_test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="pair directory")
    ap.add_argument("--method", default="ddtree", choices=("dflash", "ddtree"))
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=64, help="independent seeded requests per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=4, help="report the z-test over this many growing prefixes")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    pair = load_pair(args.model)
    prompts = load_prompts(Path(args.model) / "prompts" / "heldout.jsonl", args.num_prompts)
    engine = make_engine(pair, method=args.method, budget=args.budget, max_batch=args.max_batch)
    requests = [
        GenerationRequest(input_ids=pair.tokenizer.encode(p.text), max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=derive_seed("ztest-probe", p.id, s))
        for s in range(args.samples) for p in prompts
    ]
    t0 = time.perf_counter()
    outputs = []
    chunk = args.max_batch * 4
    for start in tqdm(range(0, len(requests), chunk), desc="requests", unit="chunk"):
        outputs += engine.generate_batch(requests[start:start + chunk])
    seconds = time.perf_counter() - t0

    results = []
    for block in range(1, args.blocks + 1):
        part = outputs[: len(outputs) * block // args.blocks]
        accepted = [a for o in part for a in o.accept_lens]
        expected = [e for o in part for e in o.expected_accept_lens]
        results.append({"requests": len(part), **acceptance_z_test(accepted, expected)})
    print(f"{args.method} budget {args.budget}, T {args.temperature:g}, top-k {args.top_k}, top-p {args.top_p:g}: "
          f"{len(outputs)} requests in {seconds:.0f} s")
    print(f"{'requests':>8} {'rounds':>7} {'observed':>9} {'expected':>9} {'z':>7} {'p':>9} {'detectable':>10}")
    for r in results:
        print(f"{r['requests']:>8} {r['rounds']:>7} {r['observed']:>9.4f} {r['expected']:>9.4f} {r['z']:>7.2f} "
              f"{r['p_value']:>9.2e} {r['detectable_bias']:>10.4f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "seconds": seconds, "blocks": results}, indent=1))


if __name__ == "__main__":
    main()
