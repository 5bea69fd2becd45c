"""`ddtree bench engine`: in-process decoding of held-out prompts with `ar`, `dflash` and `ddtree`.

One run decodes every prompt with every (method, budget) at every temperature and prints one table:
method, budget, T, tau (mean committed tokens per round incl. the bonus), expected tau, time per output
token (decode only, prefill excluded, mean over responses as in the paper), speedup over `ar` at the
same T, mean per-stage ms per round and, at T = 0, the rate of outputs token-identical to `ar`'s.
Configurations are interleaved per prompt so that drifting machine load hits all of them alike.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddtree.bench.text_table import text_table
from ddtree.engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    METHODS,
    STAGE_TIMES,
    STAGE_TIMES_HELP,
    STAGES,
    GenerationOutput,
    GenerationRequest,
    stage_times_on,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="pair directory (target/ + drafter/); or --random-weights")
    parser.add_argument("--prompts", default=None, help="JSON lines with a 'text' field (default PAIR/prompts/heldout.jsonl)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="keep the last N prompt tokens")
    parser.add_argument("--budgets", default="8,16,32,64", help="comma-separated ddtree budgets")
    parser.add_argument("--temperatures", default="0,1", help="comma-separated temperatures")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0, help="request seed = seed + prompt index")
    parser.add_argument(
        "--warmup-seconds", type=float, default=None,
        help="keep warming up (all configurations in turn) for at least this long before timing; default 0 on "
        "CPU, 45 on CUDA (on the lent H200 the first ~30-60 s of a process ran about 6x slower)",
    )
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the whole timed pass this many times in this process and report how far the "
                        "repeats' time per token differs (each repeat's table is printed)")
    parser.add_argument("--stage-times", default="auto", choices=STAGE_TIMES,
                        help=STAGE_TIMES_HELP + "; the per-stage columns show - when off")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json-out", default=None, help="write the summary rows and per-request records here")
    parser.add_argument("--max-batch", type=int, default=1, help="engine batch capacity (this benchmark decodes one "
                        "request at a time; the server's concurrency sweep measures batching)")
    from ddtree.bench.cost_model import add_arguments as add_cost_model_arguments

    add_cost_model_arguments(parser)


def parse_list(text: str, kind: type, name: str) -> list[Any]:
    """'8,16' -> [8, 16]; ValueError naming the option on a bad item."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of {kind.__name__}, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} is empty")
    return values


def configurations(methods: Sequence[str], budgets: Sequence[int]) -> list[tuple[str, int | None]]:
    """(method, budget) pairs in table order (METHODS' order: ar first, the speedup reference)."""
    configs: list[tuple[str, int | None]] = []
    for method in METHODS:
        if method not in methods:
            continue
        if method == "ddtree":
            configs.extend(("ddtree", b) for b in budgets)
        else:
            configs.append((method, None))
    return configs


def time_per_output_token(output: GenerationOutput) -> float | None:
    """Decode seconds per token after the first (prefill and the first pick are the TTFT)."""
    n = len(output.output_ids) - 1
    return output.decode_time / n if n > 0 else None


def summarize(outputs: list[GenerationOutput], ar_outputs: list[GenerationOutput] | None) -> dict[str, Any]:
    """Pooled tau / expected tau, mean per-response TPOT, mean stage ms per round, greedy match rate."""
    rounds = sum(o.rounds for o in outputs)
    committed = sum(sum(o.accept_lens) + len(o.accept_lens) for o in outputs)
    expected = sum(sum(o.expected_accept_lens) + len(o.expected_accept_lens) for o in outputs)
    tpots = [t for t in (time_per_output_token(o) for o in outputs) if t is not None]
    row: dict[str, Any] = {
        "requests": len(outputs),
        "output_tokens": sum(len(o.output_ids) for o in outputs),
        "rounds": rounds,
        "tau": committed / rounds if rounds else math.nan,
        "expected_tau": expected / rounds if rounds else math.nan,
        "tpot_ms": 1e3 * sum(tpots) / len(tpots) if tpots else math.nan,
        "ttft_ms": 1e3 * sum(o.ttft for o in outputs) / len(outputs),
        "stage_ms": {s: (1e3 * sum(o.stage_times[s] for o in outputs) / rounds if rounds else math.nan) for s in STAGES},
    }
    if ar_outputs is not None:
        same = [o.output_ids == a.output_ids for o, a in zip(outputs, ar_outputs)]
        row["match_ar"] = sum(same) / len(same)
    return row


def format_table(rows: list[dict[str, Any]], *, stage_times: bool = True) -> str:
    """The summary rows as a text table; without `stage_times` (stages not timed) the per-stage columns show -."""
    head = ["method", "budget", "T", "tau", "E[tau]", "tpot_ms", "speedup"] + [f"{s}_ms" for s in STAGES] + ["match_ar"]
    lines = []
    for r in rows:
        match = r.get("match_ar")
        lines.append(
            [r["method"], "-" if r["budget"] is None else str(r["budget"]), f"{r['temperature']:g}",
             f"{r['tau']:.2f}", f"{r['expected_tau']:.2f}", f"{r['tpot_ms']:.3f}", f"{r['speedup']:.2f}x"]
            + [f"{r['stage_ms'][s]:.3f}" if stage_times else "-" for s in STAGES]
            + ["-" if match is None else f"{match:.2f}"]
        )
    return text_table([head, *lines])


def _resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ddtree.bench.http_client import load_prompts, setup_logging
    from ddtree.engine.batched import make_engine
    from ddtree.engine.checks import default_dtype, resolve_dtype
    from ddtree.models.pair import load_pair

    # the engine's warm-up logs one line per captured round program: on a fresh GPU machine it also compiles the
    # Triton kernels (minutes), which would otherwise pass in silence
    setup_logging()
    budgets = parse_list(args.budgets, int, "--budgets")
    temperatures = parse_list(args.temperatures, float, "--temperatures")
    methods = parse_list(args.methods, str, "--methods")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"ddtree bench engine: unknown --methods {unknown}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.random_weights:
        from ddtree.bench.cost_model import run_cost_model

        return run_cost_model(args, methods, budgets)
    if not args.model:
        raise SystemExit("ddtree bench engine: give --model PAIR_DIR or --random-weights SHAPE")
    device = torch.device(_resolve_device(args.device))
    dtype = default_dtype(device) if args.dtype == "auto" else resolve_dtype(args.dtype, device)
    prompts_path = Path(args.prompts) if args.prompts else Path(args.model) / "prompts" / "heldout.jsonl"
    prompts = load_prompts(prompts_path, args.num_prompts)

    pair = load_pair(args.model, device=device, dtype=dtype)
    stage_times = stage_times_on(args.stage_times, device)
    engine = make_engine(pair, method="ddtree", budget=budgets[0], device=device, dtype=dtype,
                         profile_stages=stage_times,
                         max_batch=args.max_batch, max_seq_len=args.max_prompt_tokens + args.max_new_tokens + max(budgets) + 40)
    if hasattr(engine, "warmup"):
        engine.warmup([(m, b or budgets[0]) for m, b in configurations(methods, budgets)])
    room = engine.max_context - args.max_new_tokens
    keep = max(1, min(args.max_prompt_tokens, room))
    token_ids = [pair.tokenizer.encode(p.text)[-keep:] for p in prompts]
    configs = configurations(methods, budgets)

    # Warm-up: every configuration at least once (allocator, kernels, CUDA graphs of the tree builder),
    # then again in turn until the warm-up time has passed.
    warmup_s = args.warmup_seconds if args.warmup_seconds is not None else (45.0 if device.type == "cuda" else 0.0)
    if warmup_s < 0:
        raise ValueError(f"--warmup-seconds must be >= 0, got {warmup_s}")
    warm_start = time.perf_counter()
    first_pass = True
    while first_pass or time.perf_counter() - warm_start < warmup_s:
        for method, budget in configs:
            engine.generate(GenerationRequest(input_ids=token_ids[0], max_new_tokens=min(16, args.max_new_tokens)),
                            method=method, budget=budget)
        first_pass = False

    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    passes = []
    for repeat in range(args.repeats):
        rows, records, wall = _timed_pass(engine, prompts, token_ids, configs, temperatures, args, tqdm, repeat)
        print(format_table(rows, stage_times=stage_times))
        print(f"pass {repeat + 1}/{args.repeats}: {len(token_ids)} prompts x {args.max_new_tokens} new tokens, "
              f"device {device}, dtype {str(dtype).replace('torch.', '')}, threads {torch.get_num_threads()}, "
              f"wall {wall:.1f}s", flush=True)
        passes.append({"rows": rows, "records": records, "wall_s": wall})
    spread = repeat_spread([p["rows"] for p in passes])
    if args.repeats > 1:
        worst = max(spread.values(), default=0.0)
        print(f"repeats agree within {100 * worst:.1f}% (largest (max - min) / min of time per token over "
              f"{args.repeats} passes, per configuration)")
    rows, records, wall = passes[0]["rows"], passes[0]["records"], passes[0]["wall_s"]
    if args.json_out:
        payload = {
            "config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
            "device": str(device), "dtype": str(dtype).replace("torch.", ""), "stage_times": stage_times,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "wall_s": wall, "rows": rows, "records": records,
            "repeat_rows": [p["rows"] for p in passes], "repeat_spread": {str(k): v for k, v in spread.items()},
        }
        if device.type == "cuda":
            payload["gpu"] = torch.cuda.get_device_name(device)
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0


def repeat_spread(passes: list[list[dict[str, Any]]]) -> dict[tuple, float]:
    """(method, budget, T) -> (max - min) / min of the time per token over the passes."""
    by_key: dict[tuple, list[float]] = {}
    for rows in passes:
        for r in rows:
            by_key.setdefault((r["method"], r["budget"], r["temperature"]), []).append(r["tpot_ms"])
    return {k: (max(v) - min(v)) / min(v) for k, v in by_key.items() if len(v) > 1 and min(v) > 0}


def _timed_pass(engine, prompts, token_ids, configs, temperatures, args, tqdm, repeat: int):
    """Every prompt with every configuration at every temperature: summary rows, per-request records, wall s."""
    results: dict[tuple[float, str, int | None], list[GenerationOutput]] = {}
    records: list[dict[str, Any]] = []
    total = len(temperatures) * len(token_ids) * len(configs)
    bar = tqdm(total=total, desc=f"bench engine pass {repeat + 1}", disable=args.no_progress)
    t_start = time.perf_counter()
    for temperature in temperatures:
        for index, ids in enumerate(token_ids):
            for method, budget in configs:
                request = GenerationRequest(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                            temperature=temperature, seed=args.seed + index)
                out = engine.generate(request, method=method, budget=budget)
                results.setdefault((temperature, method, budget), []).append(out)
                records.append({
                    "prompt_id": prompts[index].id, "method": method, "budget": out.budget,
                    "temperature": temperature, "prompt_tokens": len(ids), "completion_tokens": len(out.output_ids),
                    "rounds": out.rounds, "tau": out.tau, "accept_lens": out.accept_lens,
                    "expected_accept_lens": out.expected_accept_lens, "stage_times": out.stage_times,
                    "ttft": out.ttft, "decode_time": out.decode_time, "tpot": time_per_output_token(out),
                    "output_ids": out.output_ids,
                })
                bar.update(1)
    bar.close()
    wall = time.perf_counter() - t_start

    rows = []
    for temperature in temperatures:
        ar = results.get((temperature, "ar", None))
        for method, budget in configs:
            outputs = results[(temperature, method, budget)]
            row = {"method": method, "budget": outputs[0].budget if method != "ar" else None,
                   "temperature": temperature,
                   **summarize(outputs, ar if (temperature == 0 and ar is not None) else None)}
            row["speedup"] = (summarize(ar, None)["tpot_ms"] / row["tpot_ms"]) if ar else math.nan
            rows.append(row)
    return rows, records, wall
