"""What a request's admission and retirement cost the device, in a batch decoding as the server's does.

The server at 8 concurrent requests is bound by the device (its loop waits for each round), and there a ddtree(32)
round took 0.66 ms against dflash's 0.61 while the same rounds without requests coming and going differ by ~2%
(`ddtree bench engine --random-weights gpu-pair`). This runs the `gpu` pair's shape with random weights (a round
emits one token a row, so a request of N new tokens lives ~N rounds) two ways per (method, budget): `churn`, a closed
loop in the engine (every finished request replaced at once by a new one, prompts of --prompt-tokens) with requests
of --new-tokens (spread by --spread, so that they finish one at a time), and `steady`, a full batch whose requests
do not finish, timed over 20 rounds from the churn's mean context (prompt + half the new tokens; attention costs
grow with the context), median of 10 batches. The difference in ms per round over the admissions per round is a
request's cost beyond its rounds (prefill, first token, retirement), on the device where the loop waits for it (the
churn loop's phases say whether it does: `wait` against launch + post + admit); the top kernels of the churn rounds
(torch.profiler) show what it is made of.

    PYTHONPATH=src python benchmarks/engine/churn_cost.py --new-tokens 20,10 --prompt-tokens 80

(`admission_cost.py` beside it times the host side of an admission alone, with no rounds.)
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from ddtree.bench.cost_model import SHAPES
from ddtree.engine.batched import BatchedEngine
from ddtree.engine.fast_model import FusedDecoder, random_drafter_for
from ddtree.engine.types import GenerationRequest


def request(prompt_tokens: int, new_tokens: int, vocab: int, gen: torch.Generator, spread: float = 0.0
            ) -> GenerationRequest:
    """A random prompt; max_new_tokens uniform in new_tokens x [1 - spread, 1 + spread] (at least 1)."""
    ids = torch.randint(0, vocab - 1, (prompt_tokens,), generator=gen).tolist()
    lo, hi = max(1, round(new_tokens * (1 - spread))), max(1, round(new_tokens * (1 + spread)))
    return GenerationRequest(input_ids=ids, max_new_tokens=int(torch.randint(lo, hi + 1, (1,), generator=gen)))


PHASES = ("launch_s", "wait_s", "post_s", "admit_s")


def random_engine(shape_name: str, configs: list[tuple[str, int]], batch: int, extra_rows: int,
                  device: torch.device) -> tuple[BatchedEngine, int]:
    """A batched engine over an architecture-shaped target and DFlash drafter with random weights (bf16 on CUDA,
    float32 elsewhere), its slots `extra_rows` + room for two rounds in flight past a request's end; and the vocab."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape, dcfg = SHAPES[shape_name]
    block = dcfg["block_size"]
    max_seq = extra_rows + 4 * block
    shape = replace(shape, max_position_embeddings=max(shape.max_position_embeddings, max_seq))
    target = FusedDecoder.random(shape, device, dtype, feature_layers=tuple(dcfg["target_layer_ids"]))
    drafter = random_drafter_for(shape, layers=dcfg["layers"], block_size=block,
                                 target_layer_ids=dcfg["target_layer_ids"], mask_token_id=shape.vocab_size - 1,
                                 device=device, dtype=dtype)
    engine = BatchedEngine(None, method=configs[0][0], budget=max(configs[0][1], 1), target=target, drafter=drafter,
                           max_batch=batch, max_seq_len=max_seq, cuda_graphs=device.type == "cuda")
    return engine, shape.vocab_size


def period_ms(engine: BatchedEngine, rounds: int, refill) -> tuple[float, float, dict[str, float]]:
    """Mean ms per round over `rounds` steps (the device is synchronised at both ends), the admissions per
    round and the loop's phases in ms per round (`LoopStats`: enqueue, wait for the device, bookkeeping after,
    admissions); `refill(finished)` admits replacements."""
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    stats = engine.loop_stats
    before = stats.as_dict()
    sync()
    t = time.perf_counter()
    for _ in range(rounds):
        refill(engine.step())
    sync()
    seconds = time.perf_counter() - t
    after = stats.as_dict()
    phases = {k: 1e3 * (after[k] - before[k]) / rounds for k in PHASES}
    return 1e3 * seconds / rounds, (after["admissions"] - before["admissions"]) / rounds, phases


def top_kernels(engine: BatchedEngine, rounds: int, refill, top: int) -> list[tuple[float, float, str]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            refill(engine.step())
    rows = [(e.device_time_total / rounds, e.count / rounds, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[0])
    total = (sum(r[0] for r in rows), sum(r[1] for r in rows), f"(all {len(rows)} kernels)")
    return [total] + rows[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="gpu-pair", choices=sorted(SHAPES))
    ap.add_argument("--configs", default="dflash:15,ddtree:16,ddtree:32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=80)
    ap.add_argument("--new-tokens", default="20,10", help="mean request lengths of the churn runs")
    ap.add_argument("--spread", type=float, default=0.5,
                    help="request lengths uniform in mean x [1 - spread, 1 + spread]: finishes come one at a time, "
                         "as the server's arrivals do (0: every request of a wave finishes in the same round, and "
                         "the loop reads that round before the next, its host work for the whole wave unhidden)")
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--top", type=int, default=25, help="kernels listed per churn run (0: no profile)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    configs = [(m, int(b)) for m, b in (c.split(":") for c in args.configs.split(","))]
    engine, vocab = random_engine(args.shape, configs, args.batch, args.prompt_tokens + 4096 + 80, device)
    gen = torch.Generator().manual_seed(0)
    print(f"{args.shape} (random weights), batch {args.batch}, prompts of {args.prompt_tokens} tokens, "
          f"{args.rounds} rounds a run, {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    results = []
    for method, budget in configs:
        engine.warmup([(method, max(budget, 1))], sampled=False)

        def admit(new_tokens: int) -> None:
            engine.admit(request(args.prompt_tokens, new_tokens, vocab, gen, args.spread), method=method,
                         budget=max(budget, 1))

        nothing = lambda finished: None  # noqa: E731
        line = {"method": method, "budget": budget}
        print(f"{method:>6} budget {budget:>3}", flush=True)
        for new_tokens in (int(x) for x in args.new_tokens.split(",")):
            def refill(finished, new_tokens=new_tokens) -> None:
                for _ in finished:
                    admit(new_tokens)

            periods = []
            for _ in range(10):  # steady, from the churn's mean context
                for _ in range(args.batch):
                    engine.admit(request(max(args.prompt_tokens + new_tokens // 2 - 10, 1), 4096, vocab, gen),
                                 method=method, budget=max(budget, 1))
                period_ms(engine, 3, nothing)
                periods.append(period_ms(engine, 20, nothing)[0])
                engine.cancel_all(RuntimeError("run done"))
            steady = statistics.median(periods)
            for _ in range(args.batch):
                admit(new_tokens)
            period_ms(engine, 30, refill)
            churn, rate, phases = period_ms(engine, args.rounds, refill)
            cost = (churn - steady) / rate if rate else float("nan")
            print(f"{'':>4}{new_tokens} new tokens: steady {steady:.3f} ms a round, churn {churn:.3f}, {rate:.3f} "
                  f"admissions a round -> {cost:.3f} ms a request beyond its rounds; the churn loop's ms a round: "
                  + ", ".join(f"{k[:-2]} {v:.3f}" for k, v in phases.items()), flush=True)
            line[f"churn_{new_tokens}"] = (steady, churn, rate, cost)
            if args.top and device.type == "cuda":
                for us, calls, name in top_kernels(engine, 50, refill, args.top):
                    print(f"      {us:8.1f} us/round {calls:6.2f} calls  {name[:100]}")
            engine.cancel_all(RuntimeError("run done"))
        results.append(line)
    print()
    print("method  budget  " + "  ".join(f"new={n}: steady_ms churn_ms adm/round cost_ms"
                                         for n in args.new_tokens.split(",")))
    for r in results:
        cells = "  ".join(f"{'':>6}{r[k][0]:10.3f} {r[k][1]:8.3f} {r[k][2]:9.3f} {r[k][3]:7.3f}"
                          for k in r if k.startswith("churn_"))
        print(f"{r['method']:>6}  {r['budget']:>6}  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
