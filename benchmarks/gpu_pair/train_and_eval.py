"""Train the `gpu` embedded pair on one GPU and measure it, in one command (issue 12, item 4).

Trains into --pair-dir (default /tmp/gpu-pair, which a warm machine keeps for the next command), then
measures on the held-out prompts: DFlash tau and DDTree tau at each budget at T = 0 (teacher-forced,
`ddtree.models.train.evaluate_acceptance`, the pair in the engine's dtype), the target's held-out loss and its
per-token entropy at T = 1 (on held-out text and on its own greedy continuations). Prints a short table;
writes $OUT/status.json after every stage (a kill still leaves the stages reached), $OUT/manifest.json and
$OUT/train_log.jsonl when done.

--smoke: the same stages with the preset scaled down to seconds, on the CPU by default (proves the script end
to end); `--smoke --device cuda` is the device command's preflight of every CUDA code path (~20 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddtree.jsonl import read_jsonl
from ddtree.models.pair import default_dtype, load_pair
from ddtree.models.sizes import PairSize, get_size
from ddtree.models.train import evaluate_acceptance, train_pair

log = logging.getLogger("gpu_pair")

# The criteria of issue 12 item 4, at T = 0 on the held-out prompts.
MIN_DFLASH_TAU = 4.0
MIN_RATIO_BUDGET, MIN_RATIO = 64, 1.3


def smoke_size() -> PairSize:
    """The gpu preset with every budget cut to seconds on a CPU (same code paths, anchors after the prompt)."""
    return dataclasses.replace(
        get_size("gpu"), name="gpu-smoke", vocab_size=512, hidden_size=64, target_layers=2,
        target_intermediate=128, num_heads=4, num_kv_heads=2, head_dim=16, drafter_layers=1,
        drafter_intermediate=128, target_layer_ids=(0, 1), seq_len=128, target_batch=8, target_max_steps=16,
        drafter_batch=8, drafter_max_steps=16, rollout_rows=64, corpus_max_train_bytes=300_000,
        tokenizer_max_bytes=200_000, max_position_embeddings=1024,
    )


class Status:
    """$OUT/status.json, rewritten after every stage."""

    def __init__(self, out: Path, t0: float) -> None:
        self.path, self.t0, self.data = out / "status.json", t0, {"stages": {}}

    def stage(self, name: str, **fields: Any) -> None:
        self.data["stages"][name] = {"at_s": round(time.perf_counter() - self.t0, 1), **fields}
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")
        log.info("stage %s: %s", name, json.dumps(fields)[:400])


def table(manifest: dict[str, Any]) -> str:
    t, d = manifest["training"]["target"], manifest["training"]["drafter"]
    acc = manifest["metrics"].get("acceptance_t0", {})
    lines = [
        f"pair {manifest['size']['name']} on {manifest['device']}: train {manifest['training']['total_s']} s",
        f"  target : {t['steps']} steps in {t['seconds']} s ({t['stopped_by']}), train loss {t['final_loss']:.3f}, "
        f"held-out loss {t['heldout_loss']:.3f}, entropy at T = 1 {t['heldout_entropy']:.3f} nats/token",
        f"  drafter: {d['steps']} steps in {d['seconds']} s ({d['stopped_by']}), train loss {d['final_loss']:.3f}, "
        f"last batch tau {d.get('last_batch_tau')}; rollouts {d.get('rollout_rows')} in {d.get('rollout_s')} s, "
        f"features {d.get('pool_features_s')} s (cached {d.get('pool_features_cached')})",
    ]
    if acc:
        lines.append(f"  T = 0, {acc['num_prompts']} held-out prompts x {acc['max_new_tokens']} new tokens, "
                     f"target entropy on its greedy text {acc['target_entropy_on_greedy']:.3f} nats/token "
                     f"(eval {acc.get('eval_s')} s)")
        lines.append(f"  {'method':<12}{'tau':>8}{'tau/prompt':>12}{'rounds':>8}{'/dflash':>9}")
        lines.append(f"  {'dflash':<12}{acc['dflash_tau']:>8.3f}{acc['dflash_tau_per_prompt_mean']:>12.3f}"
                     f"{acc['dflash_rounds']:>8}{1.0:>9.3f}")
        for B in acc["budgets"]:
            m = f"ddtree{B}"
            lines.append(f"  {m:<12}{acc[m + '_tau']:>8.3f}{acc[m + '_tau_per_prompt_mean']:>12.3f}"
                         f"{acc[m + '_rounds']:>8}{acc[m + '_over_dflash']:>9.3f}")
        ratio = acc.get(f"ddtree{MIN_RATIO_BUDGET}_over_dflash")
        ok = acc["dflash_tau"] >= MIN_DFLASH_TAU and ratio is not None and ratio >= MIN_RATIO
        lines.append(f"  criteria (DFlash tau >= {MIN_DFLASH_TAU}, DDTree({MIN_RATIO_BUDGET}) / DFlash >= "
                     f"{MIN_RATIO}): {'MET' if ok else 'NOT MET'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair-dir", default="/tmp/gpu-pair")
    ap.add_argument("--smoke", action="store_true", help="the preset scaled down to seconds")
    ap.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-prompts", type=int, default=32,
                    help="held-out prompts of the teacher-forced evaluation; 0 = train only")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budgets", default="16,32,64,128")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="wall-clock safety stop of the whole training (train_pair's max_minutes; the step "
                         "schedule is unchanged unless it is reached, then the manifest says complete: false); "
                         "default none")
    ap.add_argument("--eval-deadline-s", type=float, default=375.0,
                    help="no evaluation prompt starts after this many seconds of the script (the .sh kills "
                         "it at 400)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    t0 = time.perf_counter()
    out = Path(os.environ.get("OUT") or "results/gpu_pair")
    out.mkdir(parents=True, exist_ok=True)
    pair_dir = Path(args.pair_dir)
    budgets = tuple(int(b) for b in args.budgets.split(","))
    device = args.device or ("cpu" if args.smoke else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --smoke on a CPU)")
    if args.smoke:
        size, eval_prompts, new_tokens = smoke_size(), min(args.eval_prompts, 4), min(args.max_new_tokens, 24)
    else:
        size, eval_prompts, new_tokens = get_size("gpu"), args.eval_prompts, args.max_new_tokens
    status = Status(out, t0)
    env = {"torch": torch.__version__, "device": device, "size": size.name, "pair_dir": str(pair_dir)}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    status.stage("start", **env)

    if pair_dir.exists():
        shutil.rmtree(pair_dir)
    manifest = train_pair(pair_dir, size=size, seed=args.seed, device=device, max_minutes=args.max_minutes,
                          progress=False, evaluate=False)
    shutil.copy(pair_dir / "train_log.jsonl", out / "train_log.jsonl")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    tr = manifest["training"]
    status.stage("trained", target={k: tr["target"][k] for k in ("steps", "seconds", "stopped_by", "heldout_loss",
                                                                 "heldout_entropy")},
                 drafter={k: tr["drafter"].get(k) for k in ("steps", "seconds", "stopped_by", "last_batch_tau",
                                                            "rollout_s", "pool_features_s")},
                 total_s=tr["total_s"])

    if eval_prompts == 0:  # trained only: the engine benchmark measures the pair (tau and speed) next
        (out / "table.txt").write_text(table(manifest) + "\n")
        print(table(manifest))
        status.stage("done", wall_s=round(time.perf_counter() - t0, 1))
        return 0
    dev = torch.device(device)
    pair = load_pair(pair_dir, device=dev, dtype=default_dtype(dev))
    prompts = read_jsonl(pair_dir / "prompts" / "heldout.jsonl")
    t_eval = time.perf_counter()
    acc = evaluate_acceptance(pair, prompts, max_new_tokens=new_tokens, budgets=budgets, num_prompts=eval_prompts,
                              device=dev, deadline=t0 + args.eval_deadline_s)
    acc["eval_s"] = round(time.perf_counter() - t_eval, 2)
    acc["dtype"] = str(default_dtype(dev)).replace("torch.", "")
    manifest["metrics"]["acceptance_t0"] = acc
    for path in (pair_dir / "manifest.json", out / "manifest.json"):
        path.write_text(json.dumps(manifest, indent=2) + "\n")
    status.stage("evaluated", **{k: v for k, v in acc.items() if k.endswith(("_tau", "_over_dflash"))})
    text = table(manifest)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    status.stage("done", wall_s=round(time.perf_counter() - t0, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
