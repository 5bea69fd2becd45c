"""The tree temperature of sampled rows: expected acceptance against the factor the draft logits are divided by.

The engines build a sampled request's tree on its draft logits divided by the tree temperature 1 + T
(`ddtree.core.build_sampling.tree_logit_scale`). This sweep replaces that rule by fixed tree temperatures (1 = the raw
trees) in the batched engine and reports the exact expected tau (E[tau], 1 + the expected accepted drafts a round,
which the verify computes from the target's probabilities) over the same prompts and request seeds; dflash's E[tau]
(its argmax chain does not depend on the tree temperature) for scale. The verify is the exact one in every column:
only acceptance can change.

    PYTHONPATH=src python benchmarks/tree_temperature.py --model src/ddtree/models/embedded/small-seed0 \
        --num-prompts 16 --seeds 2 --max-new-tokens 64 --budgets 16,32,64 --temperatures 0.5,1 \
        --tree-temperatures 1,1.25,1.5,2,2.5,3 [--device cuda --dtype bfloat16]

Prints one table row per (T, budget); writes JSON to $OUT/tree_temperature.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from unittest import mock

import torch
from tqdm.auto import tqdm

from ddtree.engine import batched
from ddtree.engine.types import GenerationRequest
from ddtree.models.pair import load_pair
from ddtree.pipeline.prompts import load_embedded_prompts


def expected_tau(outputs) -> float:
    return statistics.mean(1.0 + e for out in outputs for e in out.expected_accept_lens)


def fixed_tree_temperature(tree_temperature: float):
    """A stand-in for `tree_logit_scale`: 1 / tree_temperature for sampled rows, 1 for greedy ones."""
    def scale(temperature: torch.Tensor) -> torch.Tensor:
        return torch.where(temperature == 0, torch.ones_like(temperature),
                           torch.full_like(temperature, 1.0 / tree_temperature))
    return scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=2, help="request seeds a prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", default="16,32,64")
    parser.add_argument("--temperatures", default="0.5,1")
    parser.add_argument("--tree-temperatures", default="1,1.25,1.5,2,2.5,3")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = [int(x) for x in args.budgets.split(",")]
    temperatures = [float(x) for x in args.temperatures.split(",")]
    trees = [float(x) for x in args.tree_temperatures.split(",")]
    if any(t <= 0 for t in temperatures) or any(t <= 0 for t in trees):
        parser.error("--temperatures and --tree-temperatures must be > 0 (T = 0 trees are always the raw ones)")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    pair = load_pair(args.model, args.device, dtype)
    prompts = load_embedded_prompts(args.model, "heldout")[: args.num_prompts]
    engine = batched.make_engine(pair, method="ddtree", budget=max(budgets), device=args.device, dtype=dtype)
    rows = []
    progress = tqdm(total=len(temperatures) * (1 + len(budgets) * len(trees)), desc="tree temperature")
    for temperature in temperatures:
        requests = [GenerationRequest(input_ids=pair.tokenizer(p["text"]).input_ids,
                                      max_new_tokens=args.max_new_tokens, temperature=temperature, seed=seed)
                    for p in prompts for seed in range(args.seeds)]
        dflash = expected_tau(engine.generate_batch(requests, method="dflash", budget=15))
        progress.update()
        for budget in budgets:
            row = {"temperature": temperature, "budget": budget, "dflash": round(dflash, 4), "ddtree": {}}
            for tree in trees:
                with mock.patch.object(batched, "tree_logit_scale", fixed_tree_temperature(tree)):
                    row["ddtree"][tree] = round(expected_tau(
                        engine.generate_batch(requests, method="ddtree", budget=budget)), 4)
                progress.update()
            rows.append(row)
    progress.close()
    print(f"E[tau], {len(prompts)} prompts x {args.seeds} seeds x {args.max_new_tokens} new tokens, {args.model}")
    print(f"{'T':>4} {'budget':>6} {'dflash':>7} " + " ".join(f"{'tt=' + format(t, 'g'):>8}" for t in trees)
          + "   best  1+T/raw")
    for row in rows:
        taus = row["ddtree"]
        best = max(taus, key=taus.get)
        rule = 1.0 + row["temperature"]
        gain = f"{taus[rule] / taus[1.0]:.3f}" if rule in taus and 1.0 in taus else "-"
        print(f"{row['temperature']:>4g} {row['budget']:>6} {row['dflash']:>7.3f} "
              + " ".join(f"{taus[t]:>8.3f}" for t in trees) + f"  {best:>5g}  {gain:>7}")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "tree_temperature.json").write_text(json.dumps(
            {"model": args.model, "num_prompts": len(prompts), "seeds": args.seeds,
             "max_new_tokens": args.max_new_tokens, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
