"""Batched build time on CUDA for a fresh logits buffer per call vs the same buffer every call, with the
indirect whole-build graph (the default for bf16 and budget <= 256: the graph reads each call's buffer through
its address) and with DDTREE_NO_INDIRECT_GRAPH=1 (static input copy, or the alias graph once a buffer
repeats). The heap is timed in the same run.

    PYTHONPATH=src python benchmarks/build_buffer_modes.py --cells 64x128,64x256,8x128,1x128 --json-out F
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from ddtree.bench.core import time_call
from ddtree.core.build import build_tree, clear_graph_cache


def median_ms(fn, repeats: int, warmup: int) -> float:
    return time_call(fn, torch.device("cuda"), repeats, warmup)


def cell(batch: int, budget: int, vocab: int, depth: int, repeats: int, warmup: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + budget)
    pool = [(torch.randn((batch, depth, vocab), generator=gen, device="cuda") * 3).to(torch.bfloat16) for _ in range(4)]
    calls = iter(range(10**9))
    fresh = lambda: build_tree(pool[next(calls) % 4], budget, method="batched")  # noqa: E731  another buffer each call
    same = lambda: build_tree(pool[0], budget, method="batched")  # noqa: E731
    row = {"batch": batch, "budget": budget,
           "heap_ms": median_ms(lambda: build_tree(pool[0], budget, method="heap"), repeats, warmup)}
    for mode, env in (("indirect", ""), ("copy_or_alias", "1")):
        os.environ["DDTREE_NO_INDIRECT_GRAPH"] = env
        clear_graph_cache()
        row[f"{mode}_fresh_ms"] = median_ms(fresh, repeats, warmup)
        row[f"{mode}_same_ms"] = median_ms(same, repeats, warmup)
    os.environ.pop("DDTREE_NO_INDIRECT_GRAPH")
    for key in [k for k in row if k.endswith("_fresh_ms") or k.endswith("_same_ms")]:
        row[key.replace("_ms", "_x")] = row["heap_ms"] / row[key]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default="64x128,64x256,8x128,1x128,1x256")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--depth", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    rows = []
    for spec in args.cells.split(","):
        batch, budget = (int(x) for x in spec.split("x"))
        row = cell(batch, budget, args.vocab, args.depth, args.repeats, args.warmup)
        rows.append(row)
        print(f"B={batch:3d} budget={budget:3d}: heap {row['heap_ms']:.3f} ms | indirect fresh "
              f"{row['indirect_fresh_ms']:.3f} ({row['indirect_fresh_x']:.1f}x) same {row['indirect_same_ms']:.3f} "
              f"({row['indirect_same_x']:.1f}x) | copy/alias fresh {row['copy_or_alias_fresh_ms']:.3f} "
              f"({row['copy_or_alias_fresh_x']:.1f}x) same {row['copy_or_alias_same_ms']:.3f} "
              f"({row['copy_or_alias_same_x']:.1f}x)", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
