"""Host cost of admitting and retiring a request in the batched engine, the part of a served request that is
neither a round nor the prefill's kernels: requests of one new token (each finishes at admission, so every
request is one admission and one retirement, no rounds) through `generate_batch`, on an architecture-shaped pair
with random weights. Milliseconds per request (median of --passes), wall clock, graphs on under CUDA.
Runs on any source tree whose `BatchedEngine` has `generate_batch` (old vs new: PYTHONPATH=<tree>/src).

    PYTHONPATH=src python benchmarks/engine/admission_cost.py --device cuda --shape gpu-pair --requests 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddtree.bench.cost_model import SHAPES, random_drafter_for
from ddtree.engine.batched import BatchedEngine
from ddtree.engine.fast_model import FusedDecoder
from ddtree.engine.types import GenerationRequest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gpu-pair", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--requests", type=int, default=64, help="requests a pass")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--methods", default="ddtree,ar")
    ap.add_argument("--temperatures", default="0,1")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    shape, dcfg = SHAPES[args.shape]
    target = FusedDecoder.random(shape, dev, dtype, feature_layers=tuple(dcfg["target_layer_ids"]))
    drafter = random_drafter_for(shape, layers=dcfg["layers"], block_size=dcfg["block_size"],
                                 target_layer_ids=dcfg["target_layer_ids"], mask_token_id=shape.vocab_size - 1,
                                 device=dev, dtype=dtype)
    engine = BatchedEngine(None, method="ddtree", budget=32, target=target, drafter=drafter, max_batch=8,
                           max_seq_len=1024)
    prompt = [int(x) for x in torch.randint(5, shape.vocab_size - 2, (args.prompt_tokens,))]
    for method in args.methods.split(","):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            requests = [GenerationRequest(input_ids=prompt, max_new_tokens=1, temperature=temperature, seed=i)
                        for i in range(args.requests)]
            times = []
            for i in range(args.passes + 1):  # the first pass captures the prefill program: not timed
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                engine.generate_batch(requests, method=method, budget=32)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if i:
                    times.append((time.perf_counter() - t) / len(requests) * 1e3)
            print(f"{args.shape} {method:6s} T={temperature:g} prompt {args.prompt_tokens}: "
                  f"{statistics.median(times):.3f} ms per request (passes {min(times):.3f}-{max(times):.3f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
