"""SGLang's own benchmark client, `python -m sglang.bench_serving`, against a running server.

Optional (plan key `sglang_bench`, config `throughput.sglang_bench_serving`): it gives TTFT, TPOT and
inter-token latency exactly as users measure them on their SGLang deployments, next to the
pipeline's own client, on the same prompts (the plan's prompts file, cycled to `num_prompts`) and
lengths. It needs sglang (and the `datasets` package its benchmark imports); without them the phase
is skipped and says so. One `bench_serving` run per concurrency level; its result lines (with
per-request details) are appended to `out`, and a rerun skips the levels already there.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddtree.bench.http_client import load_prompts
from ddtree.jsonl import read_jsonl

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3600.0
SUMMARY_KEYS = ("completed", "total_output_tokens", "duration", "output_throughput", "mean_ttft_ms",
                "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms",
                "mean_e2e_latency_ms", "accept_length")


def available() -> bool:
    """Whether `python -m sglang.bench_serving` can run here."""
    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("datasets") is not None


def write_custom_dataset(prompts_path: str | Path, num_prompts: int, out: str | Path) -> Path:
    """bench_serving's `custom` dataset: one conversation per line, the first turn is the prompt (the
    second only sets a length, which `--sharegpt-output-len` overrides)."""
    prompts = load_prompts(prompts_path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"conversations": [{"content": prompts[i % len(prompts)].text}, {"content": "-"}]})
             for i in range(num_prompts)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def bench_serving_command(
    url: str, dataset: str | Path, *, num_prompts: int, output_len: int, concurrency: int,
    variant: Mapping[str, Any], out: str | Path, backend: str = "sglang",
) -> list[str]:
    """argv of one run; bench_serving ignores EOS by default, so every request has `output_len` tokens."""
    if int(variant.get("top_k", -1)) not in (-1, 0):
        raise ValueError(f"sglang.bench_serving cannot send top_k (variant {variant.get('name')!r})")
    return [
        sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", url,
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(num_prompts),
        "--sharegpt-output-len", str(output_len), "--max-concurrency", str(concurrency),
        "--temperature", str(float(variant.get("temperature", 0.0))), "--top-p", str(float(variant.get("top_p", 1.0))),
        "--output-file", str(out), "--output-details", "--disable-tqdm",
    ]


def _stored_levels(out: Path) -> dict[int, dict[str, Any]]:
    return {int(row["max_concurrency"]): row for row in read_jsonl(out)} if out.is_file() else {}


def summarize(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in SUMMARY_KEYS}


def run_sglang_bench(
    url: str,
    prompts_path: str | Path,
    *,
    concurrency: Sequence[int],
    num_prompts: int,
    output_len: int,
    variant: Mapping[str, Any],
    out: str | Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Run (or resume) one bench_serving per concurrency level; a level that fails is reported in the
    summary and does not stop the others."""
    if not available():
        log.warning("sglang.bench_serving is not installed: the sglang_bench phase is skipped")
        return {"skipped": "sglang.bench_serving is not installed", "levels": {}}
    out = Path(out)
    dataset = write_custom_dataset(prompts_path, num_prompts, out.with_name(out.stem + ".prompts.jsonl"))
    stored = _stored_levels(out)
    result: dict[str, Any] = {"levels": {}, "out": str(out), "errors": 0}
    for level in concurrency:
        if level in stored:
            result["levels"][level] = {**summarize(stored[level]), "resumed": True}
            continue
        cmd = bench_serving_command(url, dataset, num_prompts=num_prompts, output_len=output_len,
                                    concurrency=int(level), variant=variant, out=out)
        log.info("sglang.bench_serving at concurrency %d: %s", level, " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        rows = _stored_levels(out)
        if done.returncode != 0 or level not in rows:
            tail = (done.stdout[-2000:] + done.stderr[-2000:]).strip()
            log.error("sglang.bench_serving failed (exit %d):\n%s", done.returncode, tail)
            result["levels"][level] = {"error": f"exit {done.returncode}: {tail[-500:]}"}
            result["errors"] += 1
            continue
        result["levels"][level] = {**summarize(rows[level]), "resumed": False}
    return result


def format_summary(result: Mapping[str, Any]) -> str:
    if result.get("skipped"):
        return f"sglang.bench_serving: skipped ({result['skipped']})"

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.1f}"

    lines = [f"sglang.bench_serving -> {result['out']}",
             f"{'conc':>5} {'done':>5} {'out tok/s':>10} {'TTFT ms':>8} {'TPOT ms':>8} {'ITL ms':>8} {'accept':>7}"]
    for level, s in result["levels"].items():
        if "error" in s:
            lines.append(f"{level:>5} error: {s['error'][:200]}")
            continue
        lines.append(f"{level:>5} {s['completed']:>5} {fmt(s['output_throughput']):>10} {fmt(s['mean_ttft_ms']):>8} "
                     f"{fmt(s['mean_tpot_ms']):>8} {fmt(s['mean_itl_ms']):>8} {fmt(s['accept_length']):>7}")
    return "\n".join(lines)
