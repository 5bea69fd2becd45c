"""`ddtree bench acceptance`: per-request acceptance statistics over HTTP.

For each prompt, sampling variant and sample, one `/generate` call; the record (`AcceptanceRecord`)
is appended to a JSON-lines file as soon as it arrives, and a rerun skips the records already
there. tau = completion_tokens / spec_verify_ct (SGLang's accept length, bonus included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree.bench.http_client import (
    Prompt,
    derive_seed,
    load_prompts,
    make_client,
    parse_json_arg,
    post_generate,
    run_bounded,
    sampling_params,
    setup_logging,
)
from ddtree.bench.schema import GREEDY_VARIANT, AcceptanceRecord, RecordLog, SchemaError, check_variant
from ddtree.engine.types import DEFAULT_MAX_NEW_TOKENS

log = logging.getLogger(__name__)

RECORD_FIELDS = AcceptanceRecord.record_fields()


@dataclass(frozen=True)
class Job:
    prompt: Prompt
    variant: dict[str, Any]
    sample_index: int
    seed: int

    @property
    def key(self) -> dict[str, Any]:
        """Its record's KEY_FIELDS values."""
        return {"prompt_id": self.prompt.id, "variant": self.variant["name"], "sample_index": self.sample_index}


def plan_jobs(prompts: Sequence[Prompt], variants: Sequence[dict[str, Any]], samples_per_prompt: int,
              seed_salt: str = "") -> list[Job]:
    """Greedy variants need one sample per prompt: more would repeat it.

    `seed_salt` (the run id in a pipeline plan) enters every request seed, so that the samples of two
    runs compared by the losslessness test (ar and each speculative run) are independent draws."""
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    jobs = []
    for prompt in prompts:
        for variant in variants:
            samples = 1 if float(variant.get("temperature", 0.0)) == 0.0 else samples_per_prompt
            for s in range(samples):
                parts = (prompt.id, variant["name"], s) if not seed_salt else (seed_salt, prompt.id, variant["name"], s)
                jobs.append(Job(prompt, variant, s, derive_seed(*parts)))
    return jobs


def _tau(completion: Any, verify_ct: Any) -> float | None:
    if isinstance(completion, int) and isinstance(verify_ct, int) and verify_ct > 0:
        return completion / verify_ct
    return None


def make_record(tags: Mapping[str, Any], job: Job, result: Any) -> AcceptanceRecord:
    """One acceptance record from a `GenerateResult` (missing meta fields, e.g. on SGLang, become null; a response
    whose fields do not fit the record is recorded as a failed request, with every measured field null)."""
    meta = result.meta
    body = result.body or {}
    completion = meta.get("completion_tokens")
    verify_ct = meta.get("spec_verify_ct")
    identity = dict(
        tags=dict(tags), prompt_id=job.prompt.id, dataset=job.prompt.dataset, variant=job.variant["name"],
        temperature=job.variant.get("temperature"), top_k=job.variant.get("top_k"), top_p=job.variant.get("top_p"),
        sample_index=job.sample_index, seed=job.seed,
    )
    measured = dict(
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=completion,
        spec_verify_ct=verify_ct,
        tau=_tau(completion, verify_ct),
        accept_lens=meta.get("accept_lens"),
        expected_accept_lens=meta.get("expected_accept_lens"),
        stage_times=meta.get("stage_times"),
        entropies=meta.get("entropies"),
        e2e_latency=meta.get("e2e_latency", result.e2e_latency if result.error is None else None),
        ttft=meta.get("ttft"),
        decode_time=meta.get("decode_time"),
        output_ids=body.get("output_ids"),
    )
    try:
        return AcceptanceRecord(**identity, **measured, error=result.error)
    except SchemaError as exc:
        return AcceptanceRecord(**identity, **dict.fromkeys(measured), error=f"response outside the record: {exc}")


def summarize(records: Sequence[AcceptanceRecord]) -> dict[str, dict[str, Any]]:
    """Per variant: counts, mean tau per request and pooled tau (sum tokens / sum rounds)."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({r.variant for r in records}):
        rows = [r for r in records if r.variant == name]
        ok = [r for r in rows if not r.error and r.tau is not None]
        taus = [r.tau for r in ok]
        rounds = sum(r.spec_verify_ct or 0 for r in ok)
        expected = [x for r in ok for x in (r.expected_accept_lens or [])]
        out[name] = {
            "requests": len(rows),
            "errors": sum(1 for r in rows if r.error),
            "mean_tau": sum(taus) / len(taus) if taus else None,
            "pooled_tau": sum(r.completion_tokens or 0 for r in ok) / rounds if rounds else None,
            "mean_expected_tau": 1.0 + sum(expected) / len(expected) if expected else None,
        }
    return out


async def run_acceptance_async(
    url: str,
    prompts_path: str | Path,
    variants: Sequence[Any],
    *,
    num_prompts: int | None,
    max_new_tokens: int,
    samples_per_prompt: int = 1,
    tags: Mapping[str, Any] | None = None,
    out: str | Path,
    concurrency: int = 1,
    seed_salt: str = "",
) -> dict[str, Any]:
    """Run (or resume) an acceptance sweep; returns counts and the per-variant summary."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not variants:
        raise ValueError("variants: at least one variant is needed")
    checked = [check_variant(v, f"variants[{i}]") for i, v in enumerate(variants)]
    if len({v["name"] for v in checked}) != len(checked):
        raise ValueError("variants: names must be unique")
    jobs = plan_jobs(load_prompts(prompts_path, num_prompts), checked, samples_per_prompt, seed_salt)
    records: list[AcceptanceRecord] = []
    with RecordLog(out, AcceptanceRecord, tags or {}) as writer:
        keys = {writer.key(**job.key) for job in jobs}
        records.extend(r for r in writer.existing if writer.key_of(r) in keys)
        todo = [job for job in jobs if not writer.is_done(**job.key)]
        if writer.skipped:
            log.info("acceptance: %d of %d records already in %s, skipped", writer.skipped, len(jobs), out)

        async with make_client(concurrency) as client:

            async def one(job: Job) -> None:
                payload = {"text": job.prompt.text,
                           "sampling_params": sampling_params(job.variant, max_new_tokens, job.seed)}
                record = make_record(writer.tags, job, await post_generate(client, url, payload))
                writer.write(record)
                records.append(record)

            await run_bounded(todo, one, concurrency, desc="acceptance")
        written, skipped = writer.written, writer.skipped
    errors = sum(1 for r in records if r.error)
    return {"planned": len(jobs), "written": written, "skipped": skipped, "errors": errors,
            "variants": summarize(records), "out": str(out)}


def run_acceptance(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(run_acceptance_async(*args, **kwargs))


def format_summary(summary: Mapping[str, Any]) -> str:
    lines = [f"acceptance: {summary['written']} written, {summary['skipped']} skipped, "
             f"{summary['errors']} errors -> {summary['out']}",
             f"{'variant':<16} {'requests':>8} {'errors':>6} {'mean tau':>9} {'pooled tau':>10} {'E[tau]':>8}"]

    def fmt(x: Any) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

    for name, s in summary["variants"].items():
        lines.append(f"{name:<16} {s['requests']:>8} {s['errors']:>6} {fmt(s['mean_tau']):>9} "
                     f"{fmt(s['pooled_tau']):>10} {fmt(s['mean_expected_tau']):>8}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--prompts", required=True, help='JSON lines {"id", "dataset", "text"}')
    parser.add_argument("--variants", default=json.dumps([dict(GREEDY_VARIANT)]),
                        help="JSON list (inline or a file) of {name, temperature, top_k, top_p}")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--samples-per-prompt", type=int, default=1)
    parser.add_argument("--tags", default="{}", help="JSON object (inline or a file) copied into every record")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", required=True, help="JSON-lines output (appended; reruns resume)")


def run(args: argparse.Namespace) -> int:
    setup_logging()
    variants = parse_json_arg(args.variants, "variants")
    if not isinstance(variants, list):
        raise SystemExit("ddtree bench acceptance: --variants must be a JSON list")
    try:
        summary = run_acceptance(
            args.url, args.prompts, variants, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
            samples_per_prompt=args.samples_per_prompt, tags=parse_json_arg(args.tags, "tags"), out=args.out,
            concurrency=args.concurrency,
        )
    except ValueError as exc:
        raise SystemExit(f"ddtree bench acceptance: {exc}") from None
    print(format_summary(summary))
    # failed requests are recorded (and retried by a rerun); only a run that measured nothing fails
    return 1 if summary["planned"] and summary["errors"] == summary["planned"] else 0
