"""`ddtree serve`: load a model pair, build the decoding engine and serve it over HTTP (uvicorn).

The engine decodes in a child process (`engine_process.EngineProcess`: models, CUDA graphs and the decoding loop
there; HTTP, tokenising and rendering here), so the two loops do not share a GIL. SIGTERM/SIGINT trigger
uvicorn's graceful shutdown with a short timeout; the engine process is a daemon of this one and leaves with it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

from ddtree.engine.types import METHODS, STAGE_TIMES, STAGE_TIMES_HELP, stage_times_on as resolve_stage_times

DTYPES = ("float32", "bfloat16", "float16")
SHUTDOWN_TIMEOUT_S = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model pair directory (target/, drafter/)")
    parser.add_argument("--method", default="ddtree", help=f"decoding method: {', '.join(METHODS)}")
    parser.add_argument("--budget", type=int, default=64, help="draft tree node budget (ddtree)")
    parser.add_argument(
        "--max-budget", type=int, default=None,
        help="largest per-request `budget` override accepted (default: --budget); larger ones get a 400",
    )
    parser.add_argument("--warmup-budgets", default="",
                        help="comma-separated ddtree budgets (<= --max-budget) whose CUDA graphs are also captured "
                             "at start, so that per-request budget overrides never capture while serving")
    parser.add_argument("--max-batch", type=int, default=8,
                        help="requests decoded together (continuous batching; Qwen3/Qwen2/Llama-layout targets)")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="per-request cache capacity in tokens: prompt + max_new_tokens + the round's working "
                             "rows (default min(4096, the model's context))")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op CPU threads of the engine process (default: torch's); on small CPU models one "
        "thread avoids OpenMP threads contending with the server's process for the cores",
    )
    parser.add_argument("--verifier", default="exact",
                        help="sampling verifier (ddtree.core.lossy_verifiers); anything but 'exact' is LOSSY, "
                             "for the report's power panel only")
    parser.add_argument("--tree-sampling", action="store_true",
                        help="build sampled requests' trees on the drafter marginals processed like the target's")
    parser.add_argument("--stage-times", default="auto", choices=STAGE_TIMES,
                        help=STAGE_TIMES_HELP + " (into every response's stage_times)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def stage_times_on(args: argparse.Namespace) -> bool:
    """`--stage-times`, with auto resolved by the device."""
    return resolve_stage_times(getattr(args, "stage_times", "auto"), args.device)


def warmup_budgets(args: argparse.Namespace) -> list[int]:
    text = getattr(args, "warmup_budgets", None) or ""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"ddtree serve: --warmup-budgets must be comma-separated ints, got {text!r}") from None


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad settings before anything heavy is loaded."""
    if args.method not in METHODS:
        raise SystemExit(f"ddtree serve: unknown --method {args.method!r}; expected one of {', '.join(METHODS)}")
    if args.budget < 1:
        raise SystemExit(f"ddtree serve: --budget must be >= 1, got {args.budget}")
    if args.max_budget is not None and args.max_budget < args.budget:
        raise SystemExit(f"ddtree serve: --max-budget ({args.max_budget}) must be >= --budget ({args.budget})")
    budgets = warmup_budgets(args)
    limit = args.max_budget if args.max_budget is not None else args.budget
    if any(b < 1 or b > limit for b in budgets):
        raise SystemExit(f"ddtree serve: --warmup-budgets must be in [1, {limit}] (--max-budget), got {budgets}")
    if args.dtype not in DTYPES:
        raise SystemExit(f"ddtree serve: unknown --dtype {args.dtype!r}; expected one of {', '.join(DTYPES)}")
    if args.max_batch < 1:
        raise SystemExit(f"ddtree serve: --max-batch must be >= 1, got {args.max_batch}")
    if not 0 <= args.port < 65536:
        raise SystemExit(f"ddtree serve: --port must be in [0, 65535], got {args.port}")
    if not Path(args.model).is_dir():
        raise SystemExit(f"ddtree serve: --model {args.model!r} is not a directory")


def _load_pair(path: str, device: str, dtype: Any) -> Any:
    for module_name in ("ddtree.models", "ddtree.models.pair"):
        module = importlib.import_module(module_name)
        if hasattr(module, "load_pair"):
            return module.load_pair(path, device=device, dtype=dtype)
    raise SystemExit("ddtree serve: ddtree.models.load_pair is not available")


def build_engine(args: argparse.Namespace) -> Any:
    """The decoding engine of `args`, warmed up (run in the engine process)."""
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    pair = _load_pair(args.model, args.device, dtype)
    from ddtree.engine.batched import make_engine

    engine = make_engine(pair, method=args.method, budget=args.budget, device=args.device, dtype=dtype,
                         max_batch=args.max_batch, max_seq_len=args.max_seq_len, verifier=args.verifier,
                         tree_sampling=args.tree_sampling, profile_stages=stage_times_on(args))
    if hasattr(engine, "warmup"):  # CUDA graphs of every batch bucket, captured before the first request
        configs = [(args.method, args.budget)] + ([("ar", 1)] if args.method != "ar" else [])
        configs += [("ddtree", b) for b in warmup_budgets(args) if ("ddtree", b) not in configs]
        engine.warmup(configs)
    return engine


def build_app(args: argparse.Namespace) -> Any:
    from ddtree.models.pair import load_tokenizer
    from ddtree.server.app import create_app
    from ddtree.server.engine_process import EngineProcess, EngineStartError

    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"ddtree serve: --threads must be >= 1, got {args.threads}")
    try:
        engine = EngineProcess(functools.partial(build_engine, args), log_level=args.log_level.upper())
    except EngineStartError as exc:
        raise SystemExit(f"ddtree serve: {exc}") from None
    return create_app(
        engine,
        load_tokenizer(args.model),
        method=args.method,
        budget=args.budget,
        max_budget=args.max_budget,
        model_name=str(args.model),
        tokenizer_path=str(Path(args.model) / "target"),  # where the pair keeps its tokenizer
        device=args.device,
        dtype=args.dtype,
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    check_args(args)
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("ddtree.server")
    log.info("loading %s (method=%s budget=%d device=%s dtype=%s)", args.model, args.method, args.budget,
             args.device, args.dtype)
    app = build_app(args)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S,
        access_log=args.log_level == "debug",
    )
    server = uvicorn.Server(config)
    server.run()
    log.info("server stopped")
    # uvicorn swallows a failed bind/startup: report it through the exit status
    return 0 if server.started else 1
