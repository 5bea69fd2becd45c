"""Does `test_prefills_beside_the_rounds_equal_eager_admissions` see a race between the prefill stream and the
rounds' stream? Runs its workload (the tiny pair, many short requests, prompts of several length buckets) with one of
the two cross-stream waits of `BatchedEngine._staged_prefill` removed, against an eager engine, and prints how many
requests decoded differently. `landed`: the next prefill no longer waits for the last admission to leave the staging
cache; `prefilled`: the landing no longer waits for its prefill. CUDA only.

    PYTHONPATH=src python benchmarks/engine/prefill_race_probe.py --drop landed
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from ddtree.engine import GenerationRequest
from ddtree.engine.batched import BatchedEngine
from ddtree.models.pair import load_pair
from ddtree.models.train import train_pair

TEXTS = ["def main(", "import os\nclass Foo:\n    def", "for i in range(", "x = [1, 2", "return self."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drop", choices=["none", "landed", "prefilled"], default="landed")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp())
    train_pair(out, size="tiny", seed=0, device="cpu", progress=False, evaluate=False)
    graphed, eager = (BatchedEngine(load_pair(out), budget=16, max_batch=4, max_seq_len=400, device="cuda",
                                    dtype=torch.float32, cuda_graphs=graphs) for graphs in (True, False))
    graphed.warmup([("ddtree", 16)])
    if args.drop != "none":
        event = getattr(graphed, f"_{args.drop}")
        original = torch.cuda.Stream.wait_event

        def wait_event(stream, ev):  # the dropped event's waits do nothing
            if ev is not event:
                original(stream, ev)

        torch.cuda.Stream.wait_event = wait_event
    prompts = [graphed.tokenizer.encode(t) for t in TEXTS]
    long_prompt = (prompts[1] * 12)[:90]
    cases = [prompts[i % 5] if i % 4 else long_prompt for i in range(23)]
    differ = total = 0
    for _ in range(args.repeats):
        for sampling in ({}, {"temperature": 0.9, "seed": 5}):
            requests = [GenerationRequest(input_ids=p, max_new_tokens=1 + i % 4, **sampling)
                        for i, p in enumerate(cases)]
            a = graphed.generate_batch(requests, method="ddtree", budget=16)
            b = eager.generate_batch(requests, method="ddtree", budget=16)
            differ += sum(x.output_ids != y.output_ids for x, y in zip(a, b))
            total += len(requests)
    print(f"wait dropped: {args.drop}; {differ} of {total} requests decoded differently from the eager engine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
