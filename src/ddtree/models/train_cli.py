"""`ddtree train-pair`: train the embedded target + DFlash drafter pair from the Python stdlib."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ddtree.models.sizes import SIZES

    parser.add_argument("--size", choices=tuple(SIZES), default="small",
                        help="pair size preset (default: small, the embedded pair; gpu: one H200, --device cuda)")
    parser.add_argument("--out", required=True, help="output pair directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="wall-clock limit on the two training phases together; a step-scheduled size "
                             "(tiny, small) that hits it is written but marked incomplete and the command "
                             "exits with status 3")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--label-mode", choices=("rollout", "greedy", "data"), default="rollout",
                        help="drafter data: target-generated rollouts (default), or real code windows "
                             "labelled with the target's greedy predictions / the data tokens")
    parser.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for the tau estimate")
    parser.add_argument("--no-eval", action="store_true", help="skip the offline acceptance estimate")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from ddtree.models.train import train_pair

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    manifest = train_pair(
        args.out, size=args.size, seed=args.seed, device=args.device, max_minutes=args.max_minutes,
        progress=not args.no_progress, evaluate=not args.no_eval, label_mode=args.label_mode,
        eval_prompts=args.eval_prompts,
    )
    summary = {"out": args.out, "size": args.size, "training": manifest["training"],
               "metrics": manifest["metrics"]}
    print(json.dumps(summary, indent=2))
    if not manifest["training"]["complete"]:
        print(f"train-pair: the pair in {args.out} is NOT the {args.size} pair: "
              f"{manifest['training']['incomplete_reason']}", file=sys.stderr)
        return 3
    return 0
