"""Where the batched build's time goes on CUDA, kernel by kernel, and how the two vocabulary-step kernels
respond to their launch parameters (issue 2: the 20x target at B = 64, budget 128).

    PYTHONPATH=src python benchmarks/select_step_sweep.py --json-out F [--quick]

1. floors: one streaming read of the logits [R, V] (torch amax) and one copy, for the bandwidth bound;
2. the statistics kernel (`_split_stats_kernel` with group maxima) over BLOCK x num_warps x programs;
3. the select kernel (`_grouped_select_kernel`) over chunk x num_warps x cap (candidates sorted directly, as a
   multiple of the padded k; 1 sends most rows to the counting path), for k = 128 and 256;
4. a torch.profiler table of the eager batched build (switches.override(no_cuda_graph=True)) at (64, 128) and (64, 256).
Kernel times are medians of CUDA-event timed calls; each configuration is checked against the default one.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

from ddtree.bench.core import time_call
from ddtree.core import triton_build as tk
from ddtree import switches
from ddtree.core.build import build_tree


def median_ms(fn, repeats: int = 30) -> float:
    return time_call(fn, torch.device("cuda"), repeats, warmup=1)


def stats_launch(x: torch.Tensor, *, block: int, warps: int, programs: int, stages: int | None, group: int = 64):
    """One launch of the statistics kernel with explicit geometry; returns (part_max, part_sum, part_min, gmax)."""
    rows, vocab = x.shape
    splits = max(1, min(programs // rows, vocab // (4 * block)))
    split_len = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    splits = triton.cdiv(vocab, split_len)
    groups = triton.cdiv(vocab, group)
    part = torch.empty((3, rows, splits), dtype=torch.float32, device=x.device)
    gmax = torch.empty((rows, groups), dtype=torch.float32, device=x.device)
    extra = {} if stages is None else {"num_stages": stages}

    def launch():
        tk._split_stats_kernel[(rows, splits)](
            x, part[0], part[1], part[2], vocab, x.stride(0), splits, part[0], gmax, groups, part[0],
            SPLIT_LEN=split_len, BLOCK=block, HIST=False, GMAX=True, GROUP=group, num_warps=warps, **extra,
        )
        return part, gmax

    return launch


def select_launch(x: torch.Tensor, stats, k: int, *, chunk: int, warps: int, cap_factor: int, group: int = 64):
    part, gmax = stats
    cap = cap_factor * max(triton.next_power_of_2(k), 16)
    launch = tk.select_launcher(x, k, (part[0], part[1], part[2], gmax), group=group, chunk=chunk, cap=cap,
                                num_warps=warps)
    return lambda: launch()[:2]  # (vals, ids)


def profile_build(batch: int, budget: int, vocab: int, depth: int) -> str:
    logits = (torch.randn((batch, depth, vocab), device="cuda") * 3).to(torch.bfloat16)
    with switches.override(no_cuda_graph=True):
        for _ in range(3):
            build_tree(logits, budget, method="batched")
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                build_tree(logits, budget, method="batched")
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64 * 15)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--quick", action="store_true", help="fewer configurations")
    parser.add_argument("--parts", default="floors,stats,select,profile", help="comma-separated parts to run")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = (torch.randn((args.rows, args.vocab), device="cuda") * 3).to(torch.bfloat16)  # [R, V]
    x_tied = x.clone()
    x_tied[::3] = x_tied[::3].round()  # exact ties: a third of the rows take the select step's counting path
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": triton.__version__, "rows": args.rows, "vocab": args.vocab}
    parts = set(args.parts.split(","))
    gbytes = x.numel() * x.element_size() / 1e9
    floors = {"amax_ms": median_ms(lambda: x.amax(-1)), "clone_ms": median_ms(lambda: x.clone())}
    floors["amax_GBps"] = gbytes / floors["amax_ms"] * 1e3
    report["floors"] = floors
    print(f"floors: amax {floors['amax_ms']:.4f} ms ({floors['amax_GBps']:.0f} GB/s), clone {floors['clone_ms']:.4f} ms",
          flush=True)

    ref = stats_launch(x, block=2048, warps=8, programs=4096, stages=None)()
    ref = (ref[0].clone(), ref[1].clone())
    stats_rows = []
    blocks, warps_list, programs_list = ((1024, 2048, 4096), (4, 8, 16), (960, 1920, 3840, 7680))
    if args.quick:
        blocks, warps_list, programs_list = (2048, 4096), (8,), (3840,)
    stats_configs = itertools.chain(
        itertools.product(blocks, warps_list, programs_list, (None,)), ((2048, 8, 3840, s) for s in (1, 3))
    )
    for block, warps, programs, stages in stats_configs if "stats" in parts else ():
        try:
            launch = stats_launch(x, block=block, warps=warps, programs=programs, stages=stages)
            part, gmax = launch()
            ms = median_ms(launch)
        except Exception as exc:  # a configuration that does not compile (e.g. out of registers) is reported
            print(f"stats block={block} warps={warps} programs={programs} stages={stages}: {type(exc).__name__}")
            continue
        gmax_ok = torch.equal(gmax, ref[1])
        row = {"block": block, "warps": warps, "programs": programs, "stages": stages, "ms": ms,
               "GBps": gbytes / ms * 1e3, "gmax_equal": gmax_ok}
        stats_rows.append(row)
        print(f"stats block={block:5d} warps={warps:2d} programs={programs:6d} stages={stages}: {ms:.4f} ms "
              f"({row['GBps']:.0f} GB/s) gmax equal {gmax_ok}", flush=True)
    report["stats"] = stats_rows

    select_rows = []
    inputs = (("random", x), ("tied", x_tied)) if "select" in parts else ()
    for (name, xs), k in itertools.product(inputs, (128, 256)):
        stats = stats_launch(xs, block=2048, warps=8, programs=4096, stages=None)()
        ref_vals, ref_ids = (t.clone() for t in select_launch(xs, stats, k, chunk=64, warps=8, cap_factor=1)())
        configs = itertools.product((32, 64), (4, 8, 16) if not args.quick else (8,), (1, 2, 4))
        for chunk, warps, cap_factor in configs:
            try:
                launch = select_launch(xs, stats, k, chunk=chunk, warps=warps, cap_factor=cap_factor)
                vals, ids = launch()
                ms = median_ms(launch)
            except Exception as exc:
                print(f"select {name} k={k} chunk={chunk} warps={warps} cap={cap_factor}: {type(exc).__name__}: "
                      f"{str(exc)[:200]}")
                continue
            same = torch.equal(ids, ref_ids) and torch.equal(vals, ref_vals)
            select_rows.append({"input": name, "k": k, "chunk": chunk, "warps": warps, "cap_factor": cap_factor,
                                "ms": ms, "same": same})
            print(f"select {name} k={k} chunk={chunk:3d} warps={warps:2d} cap={cap_factor}: {ms:.4f} ms same {same}",
                  flush=True)
    report["select"] = select_rows

    report["profiles"] = {}
    for batch, budget in ((64, 128), (64, 256)) if "profile" in parts else ():
        table = profile_build(batch, budget, args.vocab, args.rows // 64 if args.rows % 64 == 0 else 15)
        report["profiles"][f"{batch}x{budget}"] = table
        print(f"--- eager batched build B={batch} budget={budget}, 10 calls ---\n{table}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
