"""`ddtree bench <kind>`: each benchmark kind lives in its own module.

Every module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "core": ("ddtree.bench.core", "tree build and verify timings of the core (no model)"),
    "engine": ("ddtree.bench.engine_bench", "in-process decoding with ar, dflash and ddtree"),
    "acceptance": ("ddtree.bench.acceptance", "per-request acceptance over HTTP against a running server"),
    "throughput": ("ddtree.bench.throughput", "concurrency sweep over HTTP against a running server"),
    "session": ("ddtree.bench.session", "start a server, run the benchmarks of a plan, always stop the server"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_kind", required=True)
    for name, (module_name, help_text) in BENCHMARKS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_bench_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a benchmark whose module is missing stays listed with the reason
            sub_parser.set_defaults(_bench_import_error=str(exc))
            continue
        module.add_arguments(sub_parser)


def run(args: argparse.Namespace) -> int:
    error = getattr(args, "_bench_import_error", None)
    if error:
        raise SystemExit(f"ddtree bench {args.bench_kind}: unavailable ({error})")
    return int(importlib.import_module(args._bench_module).run(args) or 0)
