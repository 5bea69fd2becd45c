"""`ddtree bench throughput`: a concurrency sweep over HTTP.

For each concurrency level c, N `/generate` requests with at most c in flight; one record per
request (`ThroughputRecord`) appended as it arrives; a rerun skips the requests already recorded.
Requests are non-streaming, so TTFT is the server's (`meta_info.ttft`, from arrival) and
TPOT = (e2e - ttft) / (completion_tokens - 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ddtree.bench.http_client import (
    derive_seed,
    load_prompts,
    make_client,
    parse_int_list,
    parse_json_arg,
    post_generate,
    run_bounded,
    sampling_params,
    setup_logging,
)
from ddtree.bench.schema import GREEDY_VARIANT, RecordLog, SchemaError, ThroughputRecord, check_variant
from ddtree.engine.types import DEFAULT_MAX_NEW_TOKENS

log = logging.getLogger(__name__)

RECORD_FIELDS = ThroughputRecord.record_fields()


def make_record(tags: Mapping[str, Any], concurrency: int, index: int, prompt_id: str,
                result: Any) -> ThroughputRecord:
    """One throughput record from a `GenerateResult` (a response whose fields do not fit the record is recorded as
    a failed request, with the measured fields null)."""
    meta = result.meta
    completion = meta.get("completion_tokens")
    ttft = meta.get("ttft")
    ok = result.error is None
    tpot = None
    if ok and isinstance(completion, int) and completion > 1 and ttft is not None:
        tpot = max(result.e2e_latency - ttft, 0.0) / (completion - 1)
    elif ok and isinstance(completion, int) and completion > 0:
        tpot = result.e2e_latency / completion  # no TTFT from the server: whole latency per token
    identity = dict(tags=dict(tags), concurrency=concurrency, request_index=index, prompt_id=prompt_id,
                    start_time=result.start_time, end_time=result.end_time)
    measured = dict(completion_tokens=completion, e2e_latency=result.e2e_latency if ok else None, ttft=ttft, tpot=tpot)
    try:
        return ThroughputRecord(**identity, **measured, error=result.error)
    except SchemaError as exc:
        return ThroughputRecord(**identity, **dict.fromkeys(measured), error=f"response outside the record: {exc}")


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize_level(records: Sequence[ThroughputRecord]) -> dict[str, Any]:
    """Throughput over the wall-clock span of the level's records, latency percentiles of the successes."""
    ok = [r for r in records if not r.error]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    span = (max(r.end_time for r in records) - min(r.start_time for r in records)) if records else 0.0
    e2e = [r.e2e_latency for r in ok if r.e2e_latency is not None]
    pct = {f"e2e_p{q}": float(np.percentile(e2e, q)) if e2e else None for q in (50, 90, 99)}
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "output_tokens": tokens,
        "duration_s": span,
        "output_tokens_per_s": tokens / span if span > 0 else None,
        "mean_tpot": _mean([r.tpot for r in ok if r.tpot is not None]),
        "mean_ttft": _mean([r.ttft for r in ok if r.ttft is not None]),
        **pct,
    }


async def run_throughput_async(
    url: str,
    prompts_path: str | Path,
    *,
    concurrency: Sequence[int],
    num_requests: int,
    max_new_tokens: int,
    variant: Any = None,
    tags: Mapping[str, Any] | None = None,
    out: str | Path,
    budget: int | None = None,
) -> dict[str, Any]:
    """Run (or resume) the sweep; the summary of a level covers this run's requests when there are
    any (a resumed level's earlier records have their own wall-clock span), else the stored ones."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    levels = parse_int_list(concurrency, "concurrency")
    variant = check_variant(variant if variant is not None else GREEDY_VARIANT)
    prompts = load_prompts(prompts_path)
    result: dict[str, Any] = {"levels": {}, "written": 0, "skipped": 0, "errors": 0, "out": str(out)}
    with RecordLog(out, ThroughputRecord, tags or {}) as writer:
        stored = {writer.key_of(r): r for r in writer.existing}
        for level in levels:
            todo, old = [], []
            for i in range(num_requests):
                if writer.is_done(concurrency=level, request_index=i):
                    old.append(stored[writer.key(concurrency=level, request_index=i)])
                else:
                    todo.append(i)
            new: list[ThroughputRecord] = []
            async with make_client(level) as client:

                async def one(i: int, level: int = level, client: Any = client) -> None:
                    prompt = prompts[i % len(prompts)]
                    seed = derive_seed("throughput", i) if float(variant["temperature"]) > 0 else None
                    payload = {"text": prompt.text, "sampling_params": sampling_params(variant, max_new_tokens, seed)}
                    if budget is not None:  # the server's per-request override (bounded by its --max-budget)
                        payload["budget"] = budget
                    record = make_record(writer.tags, level, i, prompt.id, await post_generate(client, url, payload))
                    writer.write(record)
                    new.append(record)

                await run_bounded(todo, one, level, desc=f"throughput c={level}")
            summary = summarize_level(new if new else old)
            summary.update(concurrency=level, resumed=len(old))
            result["levels"][level] = summary
            result["errors"] += summary["errors"]
        result["written"], result["skipped"] = writer.written, writer.skipped
    return result


def run_throughput(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(run_throughput_async(*args, **kwargs))


def format_summary(result: Mapping[str, Any]) -> str:
    def fmt(x: Any, scale: float = 1.0) -> str:
        return "-" if x is None else f"{x * scale:.1f}"

    lines = [f"throughput: {result['written']} written, {result['skipped']} skipped -> {result['out']}",
             f"{'conc':>5} {'reqs':>5} {'errors':>6} {'out tok/s':>10} {'TPOT ms':>8} {'TTFT ms':>8} "
             f"{'e2e p50 s':>9} {'p90 s':>7} {'p99 s':>7}"]
    for level, s in result["levels"].items():
        lines.append(f"{level:>5} {s['requests']:>5} {s['errors']:>6} {fmt(s['output_tokens_per_s']):>10} "
                     f"{fmt(s['mean_tpot'], 1e3):>8} {fmt(s['mean_ttft'], 1e3):>8} "
                     f"{fmt(s['e2e_p50']):>9} {fmt(s['e2e_p90']):>7} {fmt(s['e2e_p99']):>7}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--prompts", required=True, help='JSON lines {"id", "dataset", "text"}')
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--num-requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--variant", default=json.dumps(dict(GREEDY_VARIANT)),
                        help="JSON object (inline or a file) {name, temperature, top_k, top_p}")
    parser.add_argument("--tags", default="{}", help="JSON object (inline or a file) copied into every record")
    parser.add_argument("--out", required=True, help="JSON-lines output (appended; reruns resume)")
    parser.add_argument("--budget", type=int, default=None,
                        help="ddtree budget sent with every request (default: the server's --budget)")


def run(args: argparse.Namespace) -> int:
    setup_logging()
    try:
        result = run_throughput(
            args.url, args.prompts, concurrency=args.concurrency, num_requests=args.num_requests,
            max_new_tokens=args.max_new_tokens, variant=parse_json_arg(args.variant, "variant"),
            tags=parse_json_arg(args.tags, "tags"), out=args.out, budget=args.budget,
        )
    except ValueError as exc:
        raise SystemExit(f"ddtree bench throughput: {exc}") from None
    print(format_summary(result))
    # failed requests are recorded (and retried by a rerun); only a run that measured nothing fails
    requests = sum(s["requests"] for s in result["levels"].values())
    return 1 if requests and result["errors"] == requests else 0
