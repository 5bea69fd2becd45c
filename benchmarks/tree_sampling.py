"""Tree choice when sampling (issue 14, item 3): tau and exact expected acceptance per sampling variant and policy.

Three policies for sampled requests' trees, all with the same exact verify (only acceptance can change): `tempered`,
the default (the draft logits divided by the tree temperature 1 + T, `core/build_sampling.tree_logit_scale`); `raw`,
the draft logits as they are (`DDTREE_RAW_SAMPLED_TREES=1`, the default before session 20); `processed`, the
drafter's marginals processed like the target's (`tree_sampling=True`). Same prompts and request seeds for all.

    PYTHONPATH=src python benchmarks/tree_sampling.py --model resources/models/embedded-small \
        --num-prompts 8 --samples 4 --max-new-tokens 64 --budget 16 [--device cuda --dtype bfloat16]

Prints one row per (variant, policy) and writes JSON to $OUT/tree_sampling.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from ddtree import switches
from ddtree.engine.engine import DecodingEngine
from ddtree.engine.types import DEFAULT_MAX_NEW_TOKENS, GenerationRequest
from ddtree.jsonl import read_jsonl
from ddtree.models.pair import load_pair

VARIANTS = [
    ("t0.3", 0.3, -1, 1.0), ("t0.6", 0.6, -1, 1.0), ("t1", 1.0, -1, 1.0), ("t0.7-p0.9", 0.7, -1, 0.9),
    ("t1-k20", 1.0, 20, 1.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    prompts = [pair.tokenizer(r["text"]).input_ids
               for r in read_jsonl(Path(args.model) / "prompts" / "heldout.jsonl")[: args.num_prompts]]
    def engine(policy: str) -> DecodingEngine:
        with switches.override(raw_sampled_trees=policy == "raw"):  # read when the engine is built
            return DecodingEngine(pair, method="ddtree", budget=args.budget, device=args.device, dtype=args.dtype,
                                  tree_sampling=policy == "processed")

    engines = {policy: engine(policy) for policy in ("tempered", "raw", "processed")}
    rows = []
    print(f"{'variant':<10} {'policy':<9} {'tau':>6} {'E[tau]':>7} {'ms/tok':>7} {'requests':>8}")
    for name, t, k, p in VARIANTS:
        for policy, engine in engines.items():
            taus, exp_taus, tpots = [], [], []
            for i, ids in enumerate(prompts):
                for s in range(args.samples):
                    req = GenerationRequest(input_ids=ids, max_new_tokens=args.max_new_tokens, temperature=t, top_k=k,
                                            top_p=p, seed=1000 * i + s)
                    out = engine.generate(req)
                    taus.append(out.tau)
                    exp_taus.append(1.0 + statistics.fmean(out.expected_accept_lens))
                    tpots.append(1e3 * out.decode_time / max(len(out.output_ids) - 1, 1))
            row = {"variant": name, "temperature": t, "top_k": k, "top_p": p, "policy": policy,
                   "tau": statistics.fmean(taus), "expected_tau": statistics.fmean(exp_taus),
                   "ms_per_token": statistics.fmean(tpots), "requests": len(taus),
                   "tau_sem": statistics.stdev(taus) / len(taus) ** 0.5 if len(taus) > 1 else float("nan")}
            rows.append(row)
            print(f"{name:<10} {policy:<9} {row['tau']:6.3f} {row['expected_tau']:7.3f} {row['ms_per_token']:7.2f} "
                  f"{row['requests']:8d}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "tree_sampling.json").write_text(json.dumps(
            {"args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
