"""Where the device sits idle in a batch decoding as the server's does, and what the host was doing meanwhile.

`churn_cost.py` finds a request's cost beyond its rounds (~0.48 ms of device time at batch 8 on the `gpu` pair's
shape) but only ~0.12 ms of it in kernels. This runs the same closed loop (every finished request replaced at once)
under torch.profiler with the engine's host phases labelled (`launch`, `read`, `apply`, `retire`, `admit`, the
scheduler's `refill`), then takes the union of the device's activity (kernels, copies, memsets) over the profiled
rounds and lists every idle stretch: its total, its size distribution, and which host phase was running when the
device went idle. A device that idles while the host is in `apply` / `retire` / `admit` is waiting for the host's
bookkeeping (a deeper overlap or a cheaper host path would hide it); idling in `read` means a synchronisation the
loop should not need.

    PYTHONPATH=src python benchmarks/engine/device_gaps.py --configs dflash:15,ddtree:32 --new-tokens 20
"""

from __future__ import annotations

import argparse
import bisect
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ddtree.bench.cost_model import SHAPES
from ddtree.engine.batched import BatchedEngine

# the sibling script's engine and request makers: the same shapes, prompts and lengths
from churn_cost import random_engine, request  # noqa: E402

LABELLED = {"_launch": "launch", "_read": "read", "_apply": "apply", "_finish_rows": "retire", "admit": "admit"}
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def label_phases(engine: BatchedEngine) -> None:
    """Wrap the engine's host phases in profiler ranges (instance attributes: the class stays as it is)."""
    for attr, name in LABELLED.items():
        inner = getattr(engine, attr)

        def labelled(*args, _inner=inner, _name=name, **kwargs):
            with record_function(_name):
                return _inner(*args, **kwargs)

        setattr(engine, attr, labelled)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def analyse(trace: dict, rounds: int, min_gap_us: float) -> dict:
    device, host = [], []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat = ev.get("cat", "")
        if cat in DEVICE_CATEGORIES:
            device.append((float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])))
        elif cat == "user_annotation" and ev.get("name") in set(LABELLED.values()) | {"refill"}:
            host.append((float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]), ev["name"]))
    busy = union(device)
    if len(busy) < 2:
        return {"error": "no device activity in the trace"}
    span = busy[-1][1] - busy[0][0]
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_gap_us]
    host.sort()
    starts = [h[0] for h in host]
    by_phase: dict[str, float] = defaultdict(float)
    for start, end in gaps:
        # the innermost labelled host range open when the device went idle (ranges nest: admit inside refill)
        i = bisect.bisect_right(starts, start) - 1
        phase = "none"
        while i >= 0:
            h_start, h_end, name = host[i]
            if h_start <= start < h_end:
                phase = name
                break
            i -= 1
            if start - h_start > 50_000:  # no range open within 50 ms: the host was between phases
                break
        by_phase[phase] += end - start
    idle = sum(e - s for s, e in gaps)
    sizes = sorted(e - s for s, e in gaps)
    return {
        "span_us_per_round": span / rounds,
        "busy_us_per_round": sum(e - s for s, e in busy) / rounds,
        "idle_us_per_round": idle / rounds,
        "gaps_per_round": len(gaps) / rounds,
        "gap_us_quantiles": [sizes[int(q * (len(sizes) - 1))] for q in (0.5, 0.9, 0.99)] if sizes else [],
        "idle_us_per_round_by_host_phase": {k: v / rounds for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="gpu-pair", choices=sorted(SHAPES))
    ap.add_argument("--configs", default="dflash:15,ddtree:32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=80)
    ap.add_argument("--new-tokens", type=int, default=20)
    ap.add_argument("--spread", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=200, help="profiled rounds a config")
    ap.add_argument("--min-gap-us", type=float, default=1.0, help="shorter idle stretches are launch latency")
    ap.add_argument("--trace-dir", default=None, help="keep the chrome traces here")
    args = ap.parse_args()
    device = torch.device("cuda")
    configs = [(m, int(b)) for m, b in (c.split(":") for c in args.configs.split(","))]
    engine, vocab = random_engine(args.shape, configs, args.batch, args.prompt_tokens + 4 * args.new_tokens + 80,
                                  device)
    label_phases(engine)
    gen = torch.Generator().manual_seed(0)
    print(f"{args.shape} (random weights), batch {args.batch}, prompts of {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens (spread {args.spread}), {args.rounds} profiled rounds, "
          f"{torch.cuda.get_device_name(device)}, overlap {engine.overlap}", flush=True)
    trace_dir = Path(args.trace_dir) if args.trace_dir else Path(tempfile.mkdtemp())
    trace_dir.mkdir(parents=True, exist_ok=True)
    for method, budget in configs:
        budget = max(budget, 1)
        engine.warmup([(method, budget)], sampled=False)

        def refill(finished, method=method, budget=budget) -> None:
            with record_function("refill"):
                for _ in finished:
                    engine.admit(request(args.prompt_tokens, args.new_tokens, vocab, gen, args.spread),
                                 method=method, budget=budget)

        for _ in range(args.batch):
            engine.admit(request(args.prompt_tokens, args.new_tokens, vocab, gen, args.spread),
                         method=method, budget=budget)
        for _ in range(60):  # past the first wave, so that finishes come one at a time
            refill(engine.step())
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.rounds):
            refill(engine.step())
        torch.cuda.synchronize()
        unprofiled = 1e6 * (time.perf_counter() - t) / args.rounds
        admissions = engine.loop_stats.admissions
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.rounds):
                refill(engine.step())
            torch.cuda.synchronize()
        admissions = engine.loop_stats.admissions - admissions
        path = trace_dir / f"{method}-{budget}.json"
        prof.export_chrome_trace(str(path))
        result = analyse(json.loads(path.read_text()), args.rounds, args.min_gap_us)
        result["admissions_per_round"] = admissions / args.rounds
        result["unprofiled_us_per_round"] = unprofiled  # the profiler's host overhead is span - this
        print(f"{method} budget {budget}: " + json.dumps(result, indent=None), flush=True)
        engine.cancel_all(RuntimeError("run done"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
