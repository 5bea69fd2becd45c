"""`ddtree bench engine --random-weights SHAPE`: what a round costs on this machine, next to its floor.

An architecture-shaped target and DFlash drafter with random weights (nothing to download) run the real
engine: `ar` steps and `dflash` / `ddtree` rounds per budget and batch size, through the same CUDA graphs as
serving. Random weights accept nothing, so a round's time is its cost. In the same process the floor of the
same shapes is measured: the chain of the round's linear layers (every weight read once per forward, the
rows of this forward; attention left out) replayed from one CUDA graph, plus the device copy bandwidth.
With a published tau the expected speedup over `ar` at that batch is tau * t_ar / t_round, printed for the
tau values passed with --tau.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from ddtree.bench.text_table import text_table
from ddtree.engine.fast_model import DecoderShape, FusedDecoder, random_drafter_for
from ddtree.engine.types import STAGES, GenerationRequest

# Dense shapes of published targets (Qwen3-Coder-30B-A3B as a dense stand-in of its active size: 8 of 128
# experts of width 768 are active per token, i.e. an MLP of width 6144) and of their DFlash drafters.
SHAPES: dict[str, tuple[DecoderShape, dict[str, Any]]] = {
    "qwen3-4b": (DecoderShape(36, 2560, 9728, 32, 8, 128, 151936, True, False, 1e-6, 1e6, 40960),
                 {"layers": 5, "block_size": 16, "target_layer_ids": [1, 9, 17, 25, 33]}),
    "qwen3-8b": (DecoderShape(36, 4096, 12288, 32, 8, 128, 151936, True, False, 1e-6, 1e6, 40960),
                 {"layers": 5, "block_size": 16, "target_layer_ids": [1, 9, 17, 25, 33]}),
    "qwen3-coder-30b-a3b-dense": (DecoderShape(48, 2048, 6144, 32, 4, 128, 151936, True, False, 1e-6, 1e7, 262144),
                                  {"layers": 5, "block_size": 16, "target_layer_ids": [1, 12, 23, 34, 45]}),
    # a small shape for checking the benchmark itself on a CPU
    "test-tiny": (DecoderShape(2, 64, 128, 4, 2, 16, 512, True, False, 1e-6, 1e4, 1024),
                  {"layers": 1, "block_size": 8, "target_layer_ids": [0, 1]}),
}


def embedded_pair_shape(size_name: str) -> tuple[DecoderShape, dict[str, Any]]:
    """The target / drafter shape of an embedded pair preset (`ddtree.models.sizes`): a trained pair's rounds cost
    what random weights of its shape cost, so its stages and kernels can be profiled without training it."""
    from ddtree.models.sizes import get_size

    size = get_size(size_name)
    shape = DecoderShape(size.target_layers, size.hidden_size, size.target_intermediate, size.num_heads,
                         size.num_kv_heads, size.head_dim, size.vocab_size, True, False, 1e-6, size.rope_theta,
                         size.max_position_embeddings)
    return shape, {"layers": size.drafter_layers, "block_size": size.block_size,
                   "target_layer_ids": list(size.target_layer_ids)}


SHAPES["gpu-pair"] = embedded_pair_shape("gpu")  # the `gpu` preset (benchmarks/gpu_pair/)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the cost-model mode (added to `ddtree bench engine`)."""
    parser.add_argument("--random-weights", default=None, choices=sorted(SHAPES),
                        help="cost model: random weights of this architecture shape instead of --model")
    parser.add_argument("--batch-sizes", default="1", help="cost model: comma-separated batch sizes")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="cost model: context length per request")
    parser.add_argument("--rounds", type=int, default=30, help="cost model: timed rounds per cell")
    parser.add_argument("--tau", default="", help="cost model: comma-separated published tau values (bonus "
                        "included) to turn round costs into expected speedups over ar")
    parser.add_argument("--no-graphs", action="store_true", help="cost model: eager rounds (no CUDA graphs)")
    parser.add_argument("--attention", default="auto",
                        help="cost model: comma-separated attention backends to compare in this run (auto, sdpa, "
                        "triton); each gets its own engine over the same weights")
    parser.add_argument("--profile-kernels", type=int, default=0, metavar="N",
                        help="cost model: also list each cell's N most expensive GPU kernels per round (torch.profiler)")


def target_floor_ms(target: FusedDecoder, rows: int, logit_rows: int, *, repeats: int = 20) -> float:
    """Median ms of one graph-replayed chain of the target's own linear layers over `rows` tokens (every weight
    read once; attention, norms and RoPE left out), with the LM head on `logit_rows` of them."""
    s = target.shape
    x = torch.randn((rows, s.hidden_size), device=target.device, dtype=target.dtype)
    q_width = s.num_heads * s.head_dim

    def chain() -> torch.Tensor:
        y = x
        for w in target.layers:
            y = torch.nn.functional.linear(torch.nn.functional.linear(y, w["qkv"])[:, :q_width], w["o"])
            y = torch.nn.functional.linear(torch.nn.functional.linear(y, w["gate_up"])[:, : s.intermediate_size], w["down"])
        return torch.nn.functional.linear(y[:logit_rows], target.lm_head)

    return _graph_median_ms(chain, target.device, repeats)


def drafter_floor_ms(drafter: torch.nn.Module, head: torch.Tensor, rows: int, logit_rows: int, *,
                     repeats: int = 20) -> float:
    """The same for the drafter's block forward (its linears, then the borrowed LM head)."""
    weight = drafter.fc.weight
    x = torch.randn((rows, weight.shape[0]), device=weight.device, dtype=weight.dtype)

    def chain() -> torch.Tensor:
        y = x
        for layer in drafter.layers:
            a, m = layer.self_attn, layer.mlp
            q = a.q_proj(y)
            a.k_proj(y), a.v_proj(y)
            y = a.o_proj(q)
            y = m.down_proj(m.gate_proj(y) * m.up_proj(y))
        return torch.nn.functional.linear(y[:logit_rows], head)

    return _graph_median_ms(chain, weight.device, repeats)


def _graph_median_ms(fn, device: torch.device, repeats: int) -> float:
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_tb_s(device: torch.device) -> float | None:
    """Device-to-device copy bandwidth (bytes read + written) over a 2 GiB buffer."""
    if device.type != "cuda":
        return None
    src = torch.empty(1 << 30, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    ms = _graph_median_ms(lambda: dst.copy_(src), device, 10)
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e12


def run_cost_model(args: argparse.Namespace, methods: list[str], budgets: list[int]) -> int:
    from ddtree.engine.batched import BatchedEngine

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape, dcfg = SHAPES[args.random_weights]
    batches = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    taus = [float(x) for x in args.tau.split(",") if x.strip()]
    block = dcfg["block_size"]
    max_columns = max([budget + 1 for budget in budgets] + [block])
    # room for every round to accept a whole block, so no request ends during a cell
    new_tokens = (args.rounds + 12) * block
    max_seq = args.prompt_tokens + new_tokens + max_columns + block + 16
    shape = replace(shape, max_position_embeddings=max(shape.max_position_embeddings, max_seq))
    t0 = time.perf_counter()
    target = FusedDecoder.random(shape, device, dtype, feature_layers=tuple(dcfg["target_layer_ids"]))
    drafter = random_drafter_for(shape, layers=dcfg["layers"], block_size=block,
                                 target_layer_ids=dcfg["target_layer_ids"], mask_token_id=shape.vocab_size - 1,
                                 device=device, dtype=dtype)
    print(f"built {args.random_weights} (random weights) in {time.perf_counter() - t0:.1f}s", flush=True)
    configs = [("ar", 0)] if "ar" in methods else []
    configs += [("dflash", block - 1)] if "dflash" in methods else []
    configs += [("ddtree", b) for b in budgets] if "ddtree" in methods else []
    bandwidth = copy_bandwidth_tb_s(device)
    rows: list[dict[str, Any]] = []
    for backend in [x.strip() for x in args.attention.split(",") if x.strip()]:
        target.use_attention(backend)
        engine = BatchedEngine(None, method="ddtree", budget=budgets[0], target=target, drafter=drafter,
                               max_batch=max(batches), max_seq_len=max_seq, cuda_graphs=not args.no_graphs,
                               attention=backend)
        print(f"attention {target.attention.backend}: max_seq_len {engine.max_seq_len}, buckets {engine.buckets}",
              flush=True)
        rows += _measure(engine, target, drafter, args, shape, configs, batches, block, new_tokens)
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ar_ms = {(r["attention"], r["batch"]): r["round_ms"] for r in rows if r["method"] == "ar"}
    print()
    print(_format_table(rows, ar_ms, taus))
    if bandwidth is not None:
        print(f"device copy bandwidth {bandwidth:.2f} TB/s; {torch.cuda.get_device_name(device)}")
    if args.json_out:
        payload = {"shape": asdict(shape), "drafter": dcfg, "device": str(device), "dtype": str(dtype),
                   "bandwidth_tb_s": bandwidth, "torch": torch.__version__, "rows": rows, "taus": taus,
                   "prompt_tokens": args.prompt_tokens, "graphs": not args.no_graphs}
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


def _measure(engine, target: FusedDecoder, drafter, args: argparse.Namespace, shape: DecoderShape,
             configs: list[tuple[str, int]], batches: list[int], block: int, new_tokens: int) -> list[dict[str, Any]]:
    """Every (batch, method, budget) cell on one engine: median round ms, per-stage ms, the floor."""
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for batch in batches:
        bucket = next(b for b in engine.buckets if b >= batch)
        for method, budget in configs:
            t_capture = time.perf_counter()
            engine.warmup([(method, max(budget, 1))], buckets=[bucket], sampled=False)
            capture_s = time.perf_counter() - t_capture
            prompt = [torch.randint(0, shape.vocab_size - 1, (args.prompt_tokens,), generator=gen).tolist()
                      for _ in range(batch)]
            for ids in prompt:
                engine.admit(GenerationRequest(input_ids=ids, max_new_tokens=new_tokens), method=method,
                             budget=max(budget, 1))
            for _ in range(3):
                engine.step()
            times = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                engine.step()
                times.append(1e3 * (time.perf_counter() - t))
            engine.profile_stages = True
            stage_ms = dict.fromkeys(STAGES, 0.0)
            walk_ms = 0.0  # inside `verify`; timed apart for the round's own-work share
            probe_rounds = 5
            for _ in range(probe_rounds):
                before = dict(engine._active[0].stage_times)
                engine.step()
                for s in STAGES:
                    stage_ms[s] += 1e3 * (engine._active[0].stage_times[s] - before[s]) / probe_rounds
                walk_ms += 1e3 * engine.round_profile.get("walk", 0.0) / probe_rounds
            engine.profile_stages = False
            kernels = _top_kernels(engine, args.profile_kernels) if args.profile_kernels else []
            engine.cancel_all(RuntimeError("benchmark cell done"))
            columns = budget + 1
            verify_floor = target_floor_ms(target, batch * columns, batch * columns)
            draft_floor = 0.0 if method == "ar" else drafter_floor_ms(drafter, target.lm_head, batch * block,
                                                                       batch * (block - 1))
            floor = verify_floor + draft_floor
            row = {"shape": args.random_weights, "attention": target.attention.backend, "batch": batch,
                   "method": method, "budget": budget,
                   "round_ms": statistics.median(times), "round_ms_p90": sorted(times)[int(0.9 * len(times))],
                   "floor_ms": floor, "verify_floor_ms": verify_floor, "draft_floor_ms": draft_floor,
                   "stage_ms": stage_ms, "capture_s": capture_s}
            row["over_floor"] = row["round_ms"] / floor
            row["host_share"] = 1 - sum(stage_ms.values()) / row["round_ms"] if row["round_ms"] else math.nan
            # the round's own work besides the forwards (issue 12: build + compile + walk + commit <= 5% of it)
            row["walk_ms"] = walk_ms
            own = stage_ms["tree_build"] + stage_ms["tree_compile"] + walk_ms + stage_ms["commit"]
            row["own_work_share"] = own / sum(stage_ms.values()) if sum(stage_ms.values()) else math.nan
            row["kernels"] = kernels
            rows.append(row)
            print(_format_row(row), flush=True)
            for k in kernels:
                print(f"      {k['us_per_round']:9.1f} us/round  {k['calls_per_round']:6.1f} calls  {k['name'][:90]}")
    return rows


def _top_kernels(engine, top: int, rounds: int = 5) -> list[dict[str, Any]]:
    """The `top` GPU kernels by device time over `rounds` rounds (per round), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if engine.device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(rounds):
            engine.step()
    events = []
    for e in prof.key_averages():
        us = e.device_time_total if engine.device.type == "cuda" else e.self_cpu_time_total
        if us > 0:
            events.append({"name": e.key, "us_per_round": us / rounds, "calls_per_round": e.count / rounds})
    events.sort(key=lambda e: -e["us_per_round"])
    total = sum(e["us_per_round"] for e in events)
    calls = sum(e["calls_per_round"] for e in events)
    return [{"name": f"(all {len(events)} kernels)", "us_per_round": total, "calls_per_round": calls}] + events[:top]


def _format_row(r: dict[str, Any]) -> str:
    stages = " ".join(f"{s}={r['stage_ms'][s]:.3f}" for s in STAGES)
    return (f"{r['attention']:<6} B={r['batch']:<3} {r['method']:<6} budget={r['budget']:<4} round {r['round_ms']:.3f} ms "
            f"(p90 {r['round_ms_p90']:.3f}), floor {r['floor_ms']:.3f} ms, x{r['over_floor']:.2f} | {stages} "
            f"(walk {r['walk_ms']:.3f}; build + compile + walk + commit {100 * r['own_work_share']:.1f}%)")


def _format_table(rows: list[dict[str, Any]], ar_ms: dict[int, float], taus: list[float]) -> str:
    head = ["attention", "B", "method", "budget", "round_ms", "floor_ms", "x_floor"] + [f"{s}_ms" for s in STAGES] + \
           ["walk_ms", "own_%"] + [f"speedup@tau={t:g}" for t in taus]
    lines = []
    for r in rows:
        line = [r["attention"], str(r["batch"]), r["method"], str(r["budget"]), f"{r['round_ms']:.3f}", f"{r['floor_ms']:.3f}",
                f"{r['over_floor']:.2f}"] + [f"{r['stage_ms'][s]:.3f}" for s in STAGES] + \
               [f"{r['walk_ms']:.3f}", f"{100 * r['own_work_share']:.1f}"]
        ar = ar_ms.get((r["attention"], r["batch"]))
        for tau in taus:
            line.append("-" if ar is None or r["method"] == "ar" else f"{tau * ar / r['round_ms']:.2f}x")
        lines.append(line)
    return text_table([head, *lines])
