"""`ddtree bench core`: tree-build and verify timings of the core, no model.

One table, one row per (batch, budget): build time of the per-request heap, the batched build and `auto`
(and, on CUDA, the batched build without CUDA-graph replay), verify time greedy vs sampling (T = 1), the
ratios heap/batched, heap/auto and sampling/greedy from the same run, and on CUDA the peak extra memory
of the sampling verify. Times are the median over `--repeats` timed calls after `--warmup` calls; on
CUDA each call is bracketed by CUDA events after a synchronisation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ddtree import switches
from ddtree.bench.text_table import text_table
from ddtree.core.build import build_paths, build_tree, choose_method

FIELDS = ("token_ids", "parents", "depths", "node_logws", "num_nodes")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=_int_list, default=[1, 8, 32, 64], help="comma-separated B values")
    parser.add_argument("--budgets", type=_int_list, default=[32, 64, 128, 256], help="comma-separated budgets")
    parser.add_argument("--vocab", type=int, default=151_936, help="V (default: Qwen3's 151,936)")
    parser.add_argument("--depth", type=int, default=15, help="D drafted positions (block size - 1)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="logits dtype (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per cell (default 20 CUDA, 3 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3 CUDA, 1 CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for CPU timings")
    parser.add_argument("--no-verify", action="store_true", help="skip the verify columns")
    parser.add_argument("--check", action="store_true", help="also check heap == batched == auto (== eager) per cell")
    parser.add_argument(
        "--breakdown", type=_int_list, default=None, metavar="B,BUDGET",
        help="also time the pieces of the batched build (vocabulary step, beam) at this one (B, budget)",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="write the rows and the setup as JSON")


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """Median milliseconds of `fn()` over `repeats` calls (CUDA events on CUDA, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(samples))


def _same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def _load_verify():
    """(verify_greedy, verify_sampling, SamplingParams) or None when the verifier is not importable yet."""
    try:
        from ddtree.core.sampling import SamplingParams
        from ddtree.core.verify import verify_greedy, verify_sampling
    except ImportError:
        return None
    return verify_greedy, verify_sampling, SamplingParams


# --------------------------------------------------------------------------------------------------
# one cell
# --------------------------------------------------------------------------------------------------


def bench_cell(
    batch: int,
    budget: int,
    *,
    vocab: int,
    depth: int,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    warmup: int,
    seed: int,
    verify: tuple | None,
    check: bool,
) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((batch, depth, vocab), generator=gen, device=device, dtype=torch.float32).mul_(3).to(dtype)
    row: dict = {"batch": batch, "budget": budget, "vocab": vocab, "depth": depth,
                 "auto_method": choose_method(batch, depth, vocab, budget, device)}
    heap_reps = max(1, min(repeats, 5)) if device.type == "cpu" else repeats
    row["heap_ms"] = time_call(lambda: build_tree(logits, budget, method="heap"), device, heap_reps, warmup)
    row["batched_ms"] = time_call(lambda: build_tree(logits, budget, method="batched"), device, repeats, warmup)
    row["auto_ms"] = time_call(lambda: build_tree(logits, budget, method="auto"), device, repeats, warmup)
    if device.type == "cuda":
        with switches.override(no_cuda_graph=True):
            row["batched_eager_ms"] = time_call(
                lambda: build_tree(logits, budget, method="batched"), device, repeats, warmup
            )
    row["heap_over_batched"] = row["heap_ms"] / row["batched_ms"]
    row["heap_over_auto"] = row["heap_ms"] / row["auto_ms"]
    if check:
        heap = build_tree(logits, budget, method="heap")
        agree = _same(heap, build_tree(logits, budget, method="batched")) and _same(
            heap, build_tree(logits, budget, method="auto")
        )
        if device.type == "cuda":
            with switches.override(no_cuda_graph=True):
                agree = agree and _same(heap, build_tree(logits, budget, method="batched"))
        row["agree"] = bool(agree)

    if verify is not None:
        verify_greedy, verify_sampling, SamplingParams = verify
        tree = build_tree(logits, budget, method="batched")
        del logits
        n = budget + 1
        target = torch.randn((batch, n, vocab), generator=gen, device=device, dtype=torch.float32).mul_(3).to(dtype)
        params = SamplingParams(temperature=1.0, top_k=-1, top_p=1.0)
        vgen = torch.Generator(device=device).manual_seed(seed + 1)
        row["greedy_ms"] = time_call(lambda: verify_greedy(tree, target), device, repeats, warmup)
        row["sampling_ms"] = time_call(
            lambda: verify_sampling(tree, target, params, generator=vgen), device, repeats, warmup
        )
        row["sampling_over_greedy"] = row["sampling_ms"] / row["greedy_ms"]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            verify_sampling(tree, target, params, generator=vgen)
            torch.cuda.synchronize(device)
            row["sampling_peak_extra_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
            row["target_logits_mib"] = target.numel() * target.element_size() / 2**20
        del target
    return row


def breakdown(batch: int, budget: int, *, vocab: int, depth: int, device: torch.device, dtype: torch.dtype,
              repeats: int, warmup: int, seed: int) -> dict:
    """Milliseconds of the pieces of one batched build (eager calls; the graph replay for the total)."""
    from ddtree.core import build as B

    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((batch, depth, vocab), generator=gen, device=device, dtype=torch.float32).mul_(3).to(dtype)
    x2d = logits.reshape(-1, vocab)
    k = min(budget, vocab)
    out = {"batch": batch, "budget": budget}
    t = lambda fn: time_call(fn, device, repeats, warmup)  # noqa: E731
    out["logsumexp(x.float())"] = t(lambda: torch.logsumexp(x2d.float(), -1))
    out["isfinite(x).all()"] = t(lambda: torch.isfinite(x2d).all())
    out["x.topk(k) raw dtype"] = t(lambda: x2d.topk(k, dim=-1))
    out["torch vocab step (reference)"] = t(lambda: B._vocab_step_torch(x2d, k))
    if B._select_applies(x2d, k):  # the CUDA bf16/fp16 step for k <= 256
        from ddtree.core.triton_build import GROUPED_SELECT_CHUNK, grouped_vocab_topk, row_lse_and_min

        out["triton row lse+min (one read)"] = t(lambda: row_lse_and_min(x2d))
        for chunk in (GROUPED_SELECT_CHUNK, 2 * GROUPED_SELECT_CHUNK):
            out[f"triton select step (one read + one program/row, chunk {chunk})"] = t(
                lambda: grouped_vocab_topk(x2d, k, group=B.GROUP, chunk=chunk))
    out["depth_topk (vocab step)"] = t(lambda: B.depth_topk(logits, k))
    logq, ids, _ = B.depth_topk(logits, k)
    js, rs, low = B._candidate_pairs(budget, k, device)
    out[f"beam torch ({js.numel()} candidates/depth)"] = t(lambda: B._beam_torch(logq, ids, js, rs, low, budget))
    beam = B._beam_torch(logq, ids, js, rs, low, budget)
    out["tree from beam torch"] = t(lambda: B._tree_from_beam_torch(*beam, budget))
    if B._triton_tail(logq, ids, js, rs, low, budget, budget) is not None:
        from ddtree.core.triton_build import beam_search, tree_from_beam

        out["beam triton (one program/request)"] = t(lambda: beam_search(logq, ids, js, rs, budget))
        out["tree from beam triton"] = t(lambda: tree_from_beam(*beam, budget))
    out["batched eager total"] = t(lambda: B._batched_tensors(logits, budget))
    if device.type == "cuda":
        out["batched graph total"] = t(lambda: build_tree(logits, budget, method="batched"))
    out["heap total"] = t(lambda: build_tree(logits, budget, method="heap"))
    return out


# --------------------------------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------------------------------

COLUMNS = [
    ("batch", "B", "{:d}"),
    ("budget", "budget", "{:d}"),
    ("heap_ms", "heap ms", "{:.3f}"),
    ("batched_ms", "batched ms", "{:.3f}"),
    ("batched_eager_ms", "eager ms", "{:.3f}"),
    ("auto_ms", "auto ms", "{:.3f}"),
    ("auto_method", "auto=", "{}"),
    ("heap_over_batched", "heap/batched", "{:.1f}x"),
    ("heap_over_auto", "heap/auto", "{:.2f}x"),
    ("greedy_ms", "greedy ms", "{:.3f}"),
    ("sampling_ms", "sampling ms", "{:.3f}"),
    ("sampling_over_greedy", "samp/greedy", "{:.2f}x"),
    ("sampling_peak_extra_mib", "samp peak MiB", "{:.0f}"),
    ("agree", "agree", "{}"),
]


def format_table(rows: list[dict]) -> str:
    cols = [c for c in COLUMNS if any(c[0] in r for r in rows) or c[0] in ("greedy_ms", "sampling_ms")]
    cells = [[title for _, title, _ in cols]]
    for r in rows:
        cells.append([fmt.format(r[key]) if key in r else "n/a" for key, _, fmt in cols])
    return text_table(cells, rule=True)


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise SystemExit(f"--dtype must name a torch floating dtype, got {dtype_name!r}")
    if args.vocab < 1 or args.depth < 1:
        raise SystemExit("--vocab and --depth must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (20 if device.type == "cuda" else 3)
    warmup = args.warmup if args.warmup is not None else (3 if device.type == "cuda" else 1)
    verify = None if args.no_verify else _load_verify()
    setup = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": dtype_name,
        "vocab": args.vocab,
        "depth": args.depth,
        "repeats": repeats,
        "warmup": warmup,
        "build_paths": dataclasses.asdict(build_paths(device)),
        "switches": dataclasses.asdict(switches.current()),
        "verify": "skipped" if args.no_verify else ("ok" if verify else "n/a (ddtree.core.verify not importable)"),
    }
    rows = []
    for batch in args.batch_sizes:
        for budget in args.budgets:
            rows.append(bench_cell(batch, budget, vocab=args.vocab, depth=args.depth, device=device, dtype=dtype,
                                   repeats=repeats, warmup=warmup, seed=args.seed, verify=verify, check=args.check))
            # progress on stderr, so a run cut short by a time limit still shows its finished cells
            print(f"cell B={batch} budget={budget}: " + ", ".join(
                f"{key}={rows[-1][key]:.3f}" for key in ("heap_ms", "batched_ms", "auto_ms") if key in rows[-1]
            ) + f", agree={rows[-1].get('agree', 'n/a')}", file=sys.stderr, flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"ddtree bench core: {setup['device_name']}, torch {setup['torch']}, logits {dtype_name}, "
          f"V={args.vocab}, D={args.depth}, build paths: {setup['build_paths']}, median of {repeats} "
          f"(warmup {warmup}), verify: {setup['verify']}")
    print(format_table(rows), flush=True)
    result = {"setup": setup, "rows": rows}
    if args.breakdown is not None:
        if len(args.breakdown) != 2:
            raise SystemExit("--breakdown takes B,BUDGET")
        pieces = breakdown(args.breakdown[0], args.breakdown[1], vocab=args.vocab, depth=args.depth, device=device,
                           dtype=dtype, repeats=repeats, warmup=warmup, seed=args.seed)
        result["breakdown"] = pieces
        print(f"breakdown at B={pieces['batch']}, budget={pieces['budget']} (ms, median):")
        for name, value in pieces.items():
            if name not in ("batch", "budget"):
                print(f"  {name:40s} {value:8.3f}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
