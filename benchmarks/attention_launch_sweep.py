"""Launch-parameter sweep of the Triton tree-attention kernel (`ddtree.engine.triton_attention`) against the
engine's SDPA path and the bytes floor, to choose `launch_shape`'s rule from one device run.

    PYTHONPATH=src python benchmarks/attention_launch_sweep.py --json-out F [options]
    # the H200 run (Qwen3-8B attention, context 512, B 1 and 8, T 257 .. 1): 908 timings of 144 launches
    # (192 kernel specialisations, ~3 CPU-minutes of compiling on a 2-core box, spread over the workers);
    # estimated 2.5-3.5 min in all; the deadline keeps it under ~4 (widest cells first)
    PYTHONPATH=src python benchmarks/attention_launch_sweep.py --grid medium --widths 257,129,65,17,1 \\
        --batch-sizes 1,8 --deadline-s 200 --json-out $OUT/attention_launch_sweep.json
    # plan only: the launches each cell would time, nothing runs
    PYTHONPATH=src python benchmarks/attention_launch_sweep.py --grid medium --dry-run --sms 132
    # CPU smoke check of the script (times meaningless; the correctness checks run; a few seconds):
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/attention_launch_sweep.py --device cpu --heads 4 \\
        --kv-heads 2 --head-dim 16 --context 40 --batch-sizes 1 --widths 1,5 --grid small --repeats 1 --layers 1

Per cell (batch B, T query tokens over a context of --context rows; every row's own tokens sit right after its
context and see each other through a random ancestor-only tree mask) it times, in ms per round of --layers
calls, each layer reading its own K/V cache (distinct caches up to 3x the L2 size, so reads are as cold as in
the model): (a) the default launch (`launch_shape`), (b) every candidate launch of the grid, (c) the engine's SDPA
path (`grouped_attention` under `attention_bias` over the whole slot capacity, as on CUDA), (d) the floor of
reading the visible K and V once at the copy bandwidth of a 2 GiB device-to-device copy. A launch's time counts
only when its output matches a float32 reference (max abs error <= tol x max(1, max |ref|)); launches that fail
to compile or launch are recorded with the reason. Times are medians of --repeats CUDA-event-timed replays of a
CUDA graph of the round (--no-graphs: eager calls) after one warm replay.

Before timing, --compile-workers processes compile every candidate once (one call each, B = 1) into Triton's
disk cache, so the serial part is loading, not compiling. --deadline-s stops timing new candidates when
reached (default, SDPA and floor are still measured); the JSON is rewritten after every cell.

JSON (--json-out): {"meta": run settings, versions, copy bandwidth, precompile summary; "cells": per (B, T):
rows, keys, tolerance, "default" / "best" / each of "configs" as {launch, tiles, programs, status (ok | wrong |
failed | skipped), correct, max_abs_err, ms, error}, "sdpa" {ms, max_abs_err}, floor_ms}. Times are ms per round.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ddtree.engine.fast_model import Visibility, attention_bias, grouped_attention
from ddtree.engine.triton_attention import Launch, launch_shape, tree_attention

GRIDS: dict[str, dict[str, tuple[int, ...]]] = {
    "small": dict(block_m=(16, 32), block_n=(32, 64), splits=(1, 2), num_warps=(4,), num_stages=(2,)),
    "medium": dict(block_m=(16, 32, 64), block_n=(32, 64, 128), splits=(1, 2, 4, 8, 16), num_warps=(4, 8),
                   num_stages=(2, 3)),
    "full": dict(block_m=(16, 32, 64), block_n=(32, 64, 128), splits=(1, 2, 4, 8, 16, 32), num_warps=(4, 8),
                 num_stages=(1, 2, 3)),
}
FIELDS = ("block_m", "block_n", "splits", "num_warps", "num_stages")
WAVES = 8  # more splits only while the grid is under WAVES programs per SM: past that they add merge work only
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # x max(1, max |ref|)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"),
                   help="auto: bfloat16 on CUDA, float32 on the CPU (the interpreter's tl.dot mishandles bfloat16)")
    p.add_argument("--heads", type=int, default=32, help="query heads (default: Qwen3-8B)")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--context", type=int, default=512, help="context rows every query token sees")
    p.add_argument("--capacity", type=int, default=None,
                   help="slot rows (SDPA reads them all); default context + 976, the slot of `ddtree bench engine "
                   "--random-weights qwen3-8b` at 512 prompt tokens (1488)")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--widths", default="1,17,65,129,257", help="query tokens T per row (ar, tree budgets 16..256)")
    p.add_argument("--layers", type=int, default=36, help="calls per timed round (Qwen3-8B: 36 layers)")
    p.add_argument("--grid", default="medium", choices=sorted(GRIDS))
    for field in FIELDS:
        p.add_argument(f"--{field.replace('_', '-')}", default=None, help=f"comma list: replaces the grid's {field}")
    p.add_argument("--sms", type=int, default=None, help="SM count for the splits cap (default: the device's)")
    p.add_argument("--repeats", type=int, default=5, help="timed replays per measurement (median)")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="time CUDA-graph replays, as the engine runs (CUDA only)")
    p.add_argument("--compile-workers", type=int, default=None,
                   help="processes that precompile the candidates (default: CPUs - 2, at most 12; 0 on the CPU)")
    p.add_argument("--deadline-s", type=float, default=0.0, help="stop timing new candidates after this many "
                   "seconds from the start (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the candidates per cell and exit")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def candidates(args: argparse.Namespace, batch: int, width: int, sms: int) -> list[Launch]:
    """The grid for one cell, less launches that can only lose: a query block past the rows (masked rows only),
    more splits than key tiles (empty programs), or more splits once the grid already had WAVES programs per SM."""
    grid = {f: tuple(ints(getattr(args, f))) if getattr(args, f) else GRIDS[args.grid][f] for f in FIELDS}
    rows = args.heads // args.kv_heads * width
    keys = args.context + width
    out = []
    for bm, bn, s, w, st in itertools.product(*(grid[f] for f in FIELDS)):
        tiles = batch * args.kv_heads * math.ceil(rows / bm)
        if bm > max(16, 1 << (rows - 1).bit_length()) or s > math.ceil(keys / bn):
            continue
        if s > 1 and tiles * (s // 2) >= WAVES * sms:
            continue
        out.append(Launch(bm, bn, s, w, st))
    return out


@dataclass
class Inputs:
    q: torch.Tensor  # [B, T, h, d]
    keys: torch.Tensor  # [caches, B, h_kv, S, d]
    values: torch.Tensor
    vis: Visibility


def make_inputs(args: argparse.Namespace, batch: int, width: int, caches: int, device: torch.device,
                dtype: torch.dtype) -> Inputs:
    """Random q and slot caches; context_len = own_start = --context; a random tree (node j's parent is a random
    earlier node, node 0 the root) as the ancestor-only own mask."""
    from ddtree.core.attention import ancestor_mask

    gen = torch.Generator(device="cpu").manual_seed(args.seed * 7919 + batch * 1000 + width)
    h, kv, d, cap = args.heads, args.kv_heads, args.head_dim, args.capacity
    # q at 2x unit scale: peaked attention, so a wrong set of keys moves the output by O(1)
    q = (2 * torch.randn((batch, width, h, d), generator=gen)).to(device, dtype)
    dev_gen = torch.Generator(device=device).manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))
    keys, values = (torch.randn((caches, batch, kv, cap, d), generator=dev_gen, device=device, dtype=dtype)
                    for _ in range(2))
    parents = (torch.rand((batch, width), generator=gen) * torch.arange(width)).long()
    parents[:, 0] = -1
    context = torch.full((batch,), args.context, dtype=torch.int64, device=device)
    vis = Visibility(context_len=context, own_start=context.clone(), own_mask=ancestor_mask(parents).to(device))
    return Inputs(q, keys, values, vis)


def reference(args: argparse.Namespace, x: Inputs) -> torch.Tensor:
    """float32 attention of layer 0 through the engine's SDPA path: [B, T, h * d]."""
    bias = attention_bias(x.vis.dense(args.capacity), args.heads // args.kv_heads, torch.float32)
    return grouped_attention(x.q.float(), x.keys[0].float(), x.values[0].float(), bias)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int, graphs: bool,
              pool: Any = None) -> float:
    """Median ms of fn() over `repeats` timed runs after one warm run: CUDA events around a graph replay
    (graphs) or an eager call on CUDA, the wall clock on the CPU."""
    if device.type != "cuda":
        fn()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(samples)
    run, graph = fn, None
    if graphs:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture, as torch asks
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            fn()
        run = graph.replay
    run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _precompile(spec: dict[str, Any], jobs: list[tuple[int, tuple[int, ...]]]) -> list[str]:
    """In a worker process: one B = 1 call per (width, launch), so Triton compiles each kernel into its disk
    cache with the same specialisation as the timed calls (B is only a grid size). Returns the failures."""
    args = argparse.Namespace(**spec)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype_name)
    inputs: dict[int, Inputs] = {}
    failed = []
    for width, fields in jobs:
        x = inputs.get(width) or inputs.setdefault(width, make_inputs(args, 1, width, 1, device, dtype))
        try:
            tree_attention(x.q, x.keys[0], x.values[0], x.vis.context_len, x.vis.own_start, x.vis.own_mask,
                           launch=Launch(*fields))
        except Exception as exc:  # noqa: BLE001 - reported again, with its reason, by the timed pass
            failed.append(f"T={width} {fields}: {type(exc).__name__}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    return failed


def precompile(args: argparse.Namespace, plan: dict[tuple[int, int], list[Launch]], workers: int) -> dict[str, Any]:
    """Compile every planned launch in `workers` processes (spawned: CUDA does not survive a fork); a launch's
    widths go to one worker, whose later widths then hit its in-memory cache."""
    by_launch: dict[Launch, set[int]] = {}
    for (_, width), launches in plan.items():
        for launch in launches:
            by_launch.setdefault(launch, set()).add(width)
    workers = min(workers, len(by_launch))
    jobs: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in range(workers)]
    for i, (launch, widths) in enumerate(sorted(by_launch.items(), key=lambda kv: astuple(kv[0]))):
        jobs[i % workers] += [(w, astuple(launch)) for w in sorted(widths)]
    spec = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))}
    t0 = time.perf_counter()
    failed: list[str] = []
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for result in pool.map(_precompile, [spec] * workers, jobs):
                failed += result
    except Exception as exc:  # noqa: BLE001 - the timed pass compiles whatever is missing itself
        failed.append(f"precompile pool: {type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    print(f"precompiled {sum(map(len, jobs))} (width, launch) pairs of {len(by_launch)} launches in {workers} "
          f"processes: {seconds:.1f} s, {len(failed)} failed", flush=True)
    return {"workers": workers, "launches": len(by_launch), "seconds": seconds, "failed": failed}


def astuple(launch: Launch) -> tuple[int, ...]:
    return tuple(getattr(launch, f) for f in FIELDS)


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes per second (read + written) of a 2 GiB device-to-device copy, median of graph replays."""
    if device.type != "cuda":
        return None
    src = torch.empty(1 << 30, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, 10, graphs=True)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def measure_cell(args: argparse.Namespace, batch: int, width: int, launches: list[Launch], device: torch.device,
                 dtype: torch.dtype, sms: int, bandwidth: float | None, start: float) -> dict[str, Any]:
    h, kv, d = args.heads, args.kv_heads, args.head_dim
    rows, keys = h // kv * width, args.context + width
    kv_bytes = 2 * batch * kv * keys * d * torch.finfo(dtype).bits // 8
    if device.type == "cuda":  # enough distinct caches that a layer's K/V has left L2 before it is read again
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
        caches = min(args.layers, max(1, math.ceil(3 * l2 / kv_bytes)))
    else:
        caches = 1
    x = make_inputs(args, batch, width, caches, device, dtype)
    ref = reference(args, x)
    tol = TOLERANCE[dtype] * max(1.0, ref.abs().max().item())
    vis = x.vis
    pool = torch.cuda.graph_pool_handle() if device.type == "cuda" and args.graphs else None

    def attention(launch: Launch | None, layer: int = 0) -> torch.Tensor:
        i = layer % caches
        return tree_attention(x.q, x.keys[i], x.values[i], vis.context_len, vis.own_start, vis.own_mask, launch)

    def rounds(call: Callable[[int], object]) -> Callable[[], None]:
        def run() -> None:
            for layer in range(args.layers):
                call(layer)
        return run

    def timed(launch: Launch | None) -> dict[str, Any]:
        chosen = launch or launch_shape(batch, kv, rows, args.capacity, device, args.head_dim)
        tiles = batch * kv * math.ceil(rows / chosen.block_m)
        row: dict[str, Any] = {"launch": asdict(chosen), "tiles": tiles, "programs": tiles * chosen.splits,
                               "correct": False, "status": "failed", "max_abs_err": None, "ms": None}
        try:
            t0 = time.perf_counter()
            out = attention(launch)
            err = (out.float() - ref).abs().max().item()
            row["first_call_s"] = time.perf_counter() - t0  # compile or disk-cache load, then the call
            row.update(max_abs_err=err, correct=bool(err <= tol), status="ok" if err <= tol else "wrong")
            if row["correct"]:
                row["ms"] = median_ms(rounds(lambda layer: attention(launch, layer)), device, args.repeats,
                                      args.graphs, pool)
        except Exception as exc:  # noqa: BLE001 - out of resources, compile errors: record and go on
            row.update(status="failed", correct=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        return row

    default = timed(None)
    bias = attention_bias(vis.dense(args.capacity), h // kv, dtype)
    sdpa_out = grouped_attention(x.q, x.keys[0], x.values[0], bias)
    sdpa = {"ms": median_ms(rounds(lambda layer: grouped_attention(x.q, x.keys[layer % caches],
                                                                   x.values[layer % caches], bias)),
                            device, args.repeats, args.graphs, pool),
            "max_abs_err": (sdpa_out.float() - ref).abs().max().item()}
    configs = []
    for launch in launches:
        if args.deadline_s and time.perf_counter() - start > args.deadline_s:
            configs.append({"launch": asdict(launch), "correct": False, "status": "skipped", "ms": None,
                            "error": "deadline"})
            continue
        configs.append(default if launch == launch_shape(batch, kv, rows, args.capacity, device, args.head_dim) and
                       default["status"] != "failed" else timed(launch))
    ok = [c for c in configs if c["correct"] and c["ms"] is not None]
    best = min(ok, key=lambda c: c["ms"]) if ok else None
    floor_ms = None if bandwidth is None else args.layers * kv_bytes / bandwidth * 1e3
    del x
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch": batch, "width": width, "rows": rows, "keys": keys, "caches": caches, "kv_bytes": kv_bytes,
            "tolerance": tol, "default": default, "sdpa": sdpa, "floor_ms": floor_ms, "best": best,
            "configs": configs}


def fmt_launch(launch: dict[str, int]) -> str:
    return "Launch({block_m}, {block_n}, {splits}, num_warps={num_warps}, num_stages={num_stages})".format(**launch)


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def print_cell(cell: dict[str, Any]) -> None:
    best, default = cell["best"], cell["default"]
    counts = {s: sum(c["status"] == s for c in cell["configs"]) for s in ("ok", "wrong", "failed", "skipped")}
    speedup = (f" ({default['ms'] / best['ms']:.2f}x default)" if best and default["ms"] else "")
    print(f"B={cell['batch']:<3d} T={cell['width']:<4d} default {fmt_ms(default['ms'])} ms "
          f"{fmt_launch(default['launch'])} [{default['status']}] | best {fmt_ms(best and best['ms'])} ms "
          f"{fmt_launch(best['launch']) if best else '-'}{speedup} | sdpa {fmt_ms(cell['sdpa']['ms'])} ms | floor "
          f"{fmt_ms(cell['floor_ms'])} ms | configs {counts}", flush=True)


def print_rule(cells: list[dict[str, Any]], kv_heads: int, sms: int, layers: int) -> None:
    """The best launch per cell, with the quantities a rule can be written in (rows, tiles, programs / SMs)."""
    print(f"\nproposed rule: best launch per (B, T), ms per round of {layers} calls; tiles = B * {kv_heads} * "
          f"cdiv(rows, block_m), waves = tiles * splits / {sms} SMs; 'near' = others within 5% of the best")
    for cell in cells:
        best = cell["best"]
        if best is None:
            print(f"  (B={cell['batch']}, T={cell['width']}): no correct launch timed")
            continue
        near = sorted((c for c in cell["configs"] if c["correct"] and c["ms"] is not None and c is not best
                       and c["ms"] <= 1.05 * best["ms"]), key=lambda c: c["ms"])[:3]
        print(f"  (B={cell['batch']}, T={cell['width']}, rows={cell['rows']}): {fmt_launch(best['launch'])}  "
              f"tiles {best['tiles']} waves {best['programs'] / sms:.1f}  {best['ms']:.3f} ms (default "
              f"{fmt_ms(cell['default']['ms'])}, sdpa {fmt_ms(cell['sdpa']['ms'])})"
              + "".join(f"\n      near: {fmt_launch(c['launch'])} {c['ms']:.3f} ms" for c in near))
    print("BEST = {")
    for cell in cells:
        if cell["best"]:
            print(f"    ({cell['batch']}, {cell['width']}): {fmt_launch(cell['best']['launch'])},")
    print("}")


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    args.dtype_name = str(dtype).removeprefix("torch.")
    args.capacity = args.capacity or args.context + 976
    batches, widths = ints(args.batch_sizes), ints(args.widths)
    if args.capacity < args.context + max(widths):
        raise SystemExit(f"--capacity {args.capacity} < context + T = {args.context + max(widths)}")
    cuda = device.type == "cuda"
    sms = args.sms or (torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4)
    args.graphs = args.graphs and cuda
    # widths outer: with a deadline the cells listed first (put the widest first) get all their candidates
    plan = {(b, t): candidates(args, b, t, sms) for t in widths for b in batches}
    for (b, t), launches in plan.items():
        print(f"B={b} T={t}: {len(launches)} candidate launches", flush=True)
    print(f"{sum(map(len, plan.values()))} timings of {len(set().union(*plan.values()))} distinct launches",
          flush=True)
    if args.dry_run:
        return 0
    import triton

    meta: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
        "triton": triton.__version__, "interpret": os.environ.get("TRITON_INTERPRET", "") == "1",
        "dtype": args.dtype_name, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
        "context": args.context, "capacity": args.capacity, "layers": args.layers, "graphs": args.graphs,
        "repeats": args.repeats, "sms": sms, "grid": args.grid, "waves_cap": WAVES, "argv": sys.argv[1:] if
        argv is None else argv,
    }
    workers = args.compile_workers if args.compile_workers is not None else (
        max(0, min(12, (os.cpu_count() or 1) - 2)) if cuda else 0)
    if workers > 0:
        rows = {t: args.heads // args.kv_heads * t for t in widths}
        with_defaults = {(b, t): [*launches, launch_shape(b, args.kv_heads, rows[t], args.capacity, device, args.head_dim)]
                         for (b, t), launches in plan.items()}
        meta["precompile"] = precompile(args, with_defaults, workers)
    bandwidth = copy_bandwidth(device)
    meta["copy_bandwidth_gbs"] = None if bandwidth is None else bandwidth / 1e9
    if bandwidth:
        print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    cells: list[dict[str, Any]] = []
    for (b, t), launches in plan.items():
        cells.append(measure_cell(args, b, t, launches, device, dtype, sms, bandwidth, start))
        print_cell(cells[-1])
        meta["elapsed_s"] = time.perf_counter() - start
        if args.json_out:  # after every cell, so a run cut short keeps what it measured
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")
    print_rule(cells, args.kv_heads, sms, args.layers)
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
