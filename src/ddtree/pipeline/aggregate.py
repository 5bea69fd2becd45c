"""Tidy tables from the benchmark records (`ddtree.bench.schema.AcceptanceRecord` / `ThroughputRecord` lines).

Every table carries the run keys (profile, pair, method, budget); `budget` is NaN for ar
and dflash. Speedup follows the paper: mean per-response time per output token (prefill
excluded) of ar divided by that of the method, per (profile, pair, dataset, variant).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from ddtree.bench.schema import AcceptanceRecord, ThroughputRecord, read_plan, read_record_file
from ddtree.pipeline.lossless import DEFAULT_ALPHA, acceptance_z_test, greedy_match, sampled_token_test

# verifier: "exact", or the lossy verifier of a power-panel run (records without it are "exact")
RUN_KEYS = ["profile", "pair", "method", "budget", "verifier"]
VARIANT_KEYS = ["variant", "temperature", "top_k", "top_p"]


def load_run_records(plan_paths: Iterable[str | Path]) -> tuple[list[dict], list[dict]]:
    """Acceptance and throughput records of every plan, read typed (each tagged with its plan's tags), as their
    on-disk mappings; records of plans without a `verifier` tag are "exact"."""
    acceptance: list[dict] = []
    throughput: list[dict] = []
    for plan_path in plan_paths:
        plan = read_plan(plan_path)
        for path, record_type, sink in ((plan.out.acceptance, AcceptanceRecord, acceptance),
                                        (plan.out.throughput, ThroughputRecord, throughput)):
            if path is not None and Path(path).is_file():
                sink.extend({"verifier": "exact", **record.to_json()}
                            for record in read_record_file(path, record_type, plan.tags))
    return acceptance, throughput


def _run_keys(record: Mapping[str, Any], extra: Sequence[str] = ()) -> dict[str, Any]:
    keys = {k: record.get(k) for k in [*RUN_KEYS, *extra]}
    keys["verifier"] = keys["verifier"] or "exact"
    return keys


def _ok(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if not r.get("error")]


def _tpot(record: Mapping[str, Any]) -> float:
    """Decode time per output token after the first (prefill and first token excluded)."""
    tokens = int(record.get("completion_tokens") or 0)
    decode = record.get("decode_time")
    if tokens < 2 or decode is None:
        return float("nan")
    return float(decode) / (tokens - 1)


def acceptance_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per request: acceptance, observed vs expected accept length, timings."""
    rows = []
    for r in records:
        accept = list(r.get("accept_lens") or [])
        expected = list(r.get("expected_accept_lens") or [])
        rows.append(
            {
                **_run_keys(r),
                "prompt_id": str(r.get("prompt_id")),
                "dataset": r.get("dataset"),
                **{k: r.get(k) for k in VARIANT_KEYS},
                "sample_index": r.get("sample_index", 0),
                "seed": r.get("seed"),
                "prompt_tokens": r.get("prompt_tokens"),
                "completion_tokens": r.get("completion_tokens"),
                "rounds": r.get("spec_verify_ct"),
                "tau": r.get("tau"),
                "mean_accept_len": float(np.mean(accept)) if accept else float("nan"),
                "mean_expected_accept_len": float(np.mean(expected)) if expected else float("nan"),
                "mean_entropy": float(np.mean(r["entropies"])) if r.get("entropies") else float("nan"),
                "e2e_latency": r.get("e2e_latency"),
                "ttft": r.get("ttft"),
                "decode_time": r.get("decode_time"),
                "tpot": _tpot(r),
                "error": r.get("error"),
            }
        )
    columns = RUN_KEYS + ["prompt_id", "dataset"] + VARIANT_KEYS + [
        "sample_index", "seed", "prompt_tokens", "completion_tokens", "rounds", "tau", "mean_accept_len",
        "mean_expected_accept_len", "mean_entropy", "e2e_latency", "ttft", "decode_time", "tpot", "error",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    return frame


def accept_histogram(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per-round accept-length histogram (bonus excluded) per run and variant."""
    rows = []
    for r in _ok(records):
        for length in r.get("accept_lens") or []:
            rows.append({**_run_keys(r, VARIANT_KEYS), "accept_len": int(length)})
    keys = RUN_KEYS + VARIANT_KEYS
    if not rows:
        return pd.DataFrame(columns=keys + ["accept_len", "rounds", "fraction"])
    frame = pd.DataFrame(rows)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    counts = frame.groupby(keys + ["accept_len"], dropna=False).size().rename("rounds").reset_index()
    totals = counts.groupby(keys, dropna=False)["rounds"].transform("sum")
    counts["fraction"] = counts["rounds"] / totals
    return counts


def stage_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per-stage seconds summed over requests, per round and as a fraction of staged time."""
    rows = []
    for r in _ok(records):
        for stage, seconds in (r.get("stage_times") or {}).items():
            rows.append(
                {
                    **_run_keys(r, ["variant", "temperature"]),
                    "stage": stage,
                    "seconds": float(seconds),
                    "rounds": int(r.get("spec_verify_ct") or 0),
                }
            )
    keys = RUN_KEYS + ["variant", "temperature", "stage"]
    if not rows:
        return pd.DataFrame(columns=keys + ["seconds", "rounds", "seconds_per_round", "fraction"])
    frame = pd.DataFrame(rows)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    out = frame.groupby(keys, dropna=False).agg(seconds=("seconds", "sum"), rounds=("rounds", "sum")).reset_index()
    out["seconds_per_round"] = out["seconds"] / out["rounds"].replace(0, np.nan)
    out["fraction"] = out["seconds"] / out.groupby(keys[:-1], dropna=False)["seconds"].transform("sum")
    return out


def throughput_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per run and concurrency: output tokens per second over the wall span, latency percentiles."""
    keys = RUN_KEYS + ["concurrency"]
    columns = keys + [
        "requests", "errors", "output_tokens", "duration_s", "output_tok_per_s", "requests_per_s",
        "mean_e2e_latency", "p50_e2e_latency", "p90_e2e_latency", "mean_ttft", "mean_tpot",
    ]
    if not records:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame([_run_keys(r, ["concurrency", "completion_tokens", "e2e_latency", "ttft", "tpot",
                                        "start_time", "end_time", "error"]) for r in records])
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    rows = []
    for group, part in frame.groupby(keys, dropna=False):
        ok = part[part["error"].isna()]
        span = float(ok["end_time"].max() - ok["start_time"].min()) if len(ok) else float("nan")
        tokens = float(ok["completion_tokens"].sum())
        rows.append(
            {
                **dict(zip(keys, group)),
                "requests": len(part),
                "errors": int(part["error"].notna().sum()),
                "output_tokens": tokens,
                "duration_s": span,
                "output_tok_per_s": tokens / span if span and span > 0 else float("nan"),
                "requests_per_s": len(ok) / span if span and span > 0 else float("nan"),
                "mean_e2e_latency": float(ok["e2e_latency"].mean()),
                "p50_e2e_latency": float(ok["e2e_latency"].quantile(0.5)) if len(ok) else float("nan"),
                "p90_e2e_latency": float(ok["e2e_latency"].quantile(0.9)) if len(ok) else float("nan"),
                "mean_ttft": float(ok["ttft"].mean()),
                "mean_tpot": float(pd.to_numeric(ok["tpot"], errors="coerce").mean()),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def speedup_table(acceptance: pd.DataFrame) -> pd.DataFrame:
    """Mean tau and time per output token per run and variant; speedup against ar's."""
    keys = ["profile", "pair", "dataset"] + VARIANT_KEYS
    columns = keys + ["method", "budget", "verifier", "requests", "tau", "mean_accept_len",
                      "mean_expected_accept_len", "mean_entropy", "mean_tpot", "ar_mean_tpot", "speedup"]
    ok = acceptance[acceptance["error"].isna()] if len(acceptance) else acceptance
    if ok.empty:
        return pd.DataFrame(columns=columns)
    grouped = (
        ok.groupby(keys + ["method", "budget", "verifier"], dropna=False)
        .agg(
            requests=("prompt_id", "size"),
            tau=("tau", "mean"),
            mean_accept_len=("mean_accept_len", "mean"),
            mean_expected_accept_len=("mean_expected_accept_len", "mean"),
            mean_entropy=("mean_entropy", "mean"),
            mean_tpot=("tpot", "mean"),
        )
        .reset_index()
    )
    ar = grouped[grouped["method"] == "ar"][keys + ["mean_tpot"]].rename(columns={"mean_tpot": "ar_mean_tpot"})
    out = grouped.merge(ar, on=keys, how="left")
    out["speedup"] = out["ar_mean_tpot"] / out["mean_tpot"]
    return out[columns]


def _outputs_by_prompt(records: Sequence[Mapping[str, Any]]) -> dict[tuple, list[int]]:
    return {(str(r["prompt_id"]), int(r.get("sample_index") or 0)): list(r["output_ids"])
            for r in records if r.get("output_ids") is not None}


def _group_runs(records: Sequence[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in _ok(records):
        key = (r.get("profile"), r.get("pair"), r.get("variant"), r.get("method"), r.get("budget"),
               r.get("verifier") or "exact")
        groups.setdefault(key, []).append(r)
    return groups


def _against_ar(groups: Mapping[tuple, list]) -> Iterator[tuple[tuple, list, list]]:
    """(key, records, ar's records of the same profile, pair and variant) for every speculative run
    that has an `ar` reference."""
    for key, part in groups.items():
        profile, pair, variant, method, _, _ = key
        if method == "ar":
            continue
        reference = groups.get((profile, pair, variant, "ar", None, "exact"))
        if reference is not None:
            yield key, part, reference


def greedy_match_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """T = 0 match rate by prompt of every speculative run against ar's outputs."""
    columns = ["profile", "pair", "variant", "method", "budget", "verifier", "n", "matches", "match_rate",
               "mean_prefix_fraction"]
    groups = _group_runs([r for r in records if float(r.get("temperature") or 0.0) == 0.0])
    rows = []
    for (profile, pair, variant, method, budget, verifier), part, reference in _against_ar(groups):
        stats = greedy_match(_outputs_by_prompt(reference), _outputs_by_prompt(part))
        rows.append({"profile": profile, "pair": pair, "variant": variant, "method": method,
                     "budget": budget, "verifier": verifier, **stats})
    frame = pd.DataFrame(rows, columns=columns)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    return frame


def sampling_test_table(
    records: Sequence[Mapping[str, Any]],
    *,
    positions: Sequence[int] = (0, 1, 2, 3),
    alpha: float = DEFAULT_ALPHA,
) -> pd.DataFrame:
    """T > 0: chi-square test per output position of each speculative run against ar."""
    columns = ["profile", "pair", "variant", "method", "budget", "verifier", "position", "n_a", "n_b",
               "categories", "binning", "statistic", "dof", "p_value", "alpha", "reject", "detectable_w"]
    groups = _group_runs([r for r in records if float(r.get("temperature") or 0.0) > 0.0])
    rows = []
    for (profile, pair, variant, method, budget, verifier), part, reference in _against_ar(groups):
        seqs_ar = [list(r["output_ids"]) for r in reference if r.get("output_ids") is not None]
        seqs = [list(r["output_ids"]) for r in part if r.get("output_ids") is not None]
        for row in sampled_token_test(seqs_ar, seqs, positions=positions, alpha=alpha):
            rows.append({"profile": profile, "pair": pair, "variant": variant, "method": method,
                         "budget": budget, "verifier": verifier, **row})
    frame = pd.DataFrame(rows, columns=columns)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    return frame


def acceptance_test_table(records: Sequence[Mapping[str, Any]], *, alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """T > 0: per speculative run and variant, the z-test of observed vs exact expected accepted drafts
    over every round of every request (lossless.acceptance_z_test)."""
    columns = ["profile", "pair", "variant", "method", "budget", "verifier", "requests", "rounds", "observed",
               "expected", "z", "p_value", "alpha", "reject", "detectable_bias"]
    groups = _group_runs([r for r in records if float(r.get("temperature") or 0.0) > 0.0])
    rows = []
    for (profile, pair, variant, method, budget, verifier), part in groups.items():
        pairs = [(a, e) for r in part for a, e in zip(r.get("accept_lens") or [], r.get("expected_accept_lens") or [])]
        if method == "ar" or not pairs:
            continue
        accepted, expected = zip(*pairs)
        rows.append({"profile": profile, "pair": pair, "variant": variant, "method": method, "budget": budget,
                     "verifier": verifier, "requests": len(part),
                     **acceptance_z_test(accepted, expected, alpha=alpha)})
    frame = pd.DataFrame(rows, columns=columns)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    return frame


def machine_load_table(summaries: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per run: the machine's cores and its 1-minute load average at the end of each timed phase (the session
    summary's `load`), with their maximum. Summaries written before sessions recorded load give no row."""
    columns = [*RUN_KEYS, "cpus", "load_acceptance", "load_throughput", "load_max"]
    rows = []
    for summary in summaries:
        samples = {s["at"]: float(s["load_1m"]) for s in summary.get("load") or []}
        if not samples:
            continue
        tags = summary.get("plan", {}).get("tags", {})
        rows.append({**_run_keys(tags), "cpus": summary.get("cpus"), "load_acceptance": samples.get("acceptance"),
                     "load_throughput": samples.get("throughput"), "load_max": max(samples.values())})
    frame = pd.DataFrame(rows, columns=columns)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce")
    return frame


def load_summaries(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The benchmark sessions' summary JSON files that exist."""
    return [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths if Path(p).is_file()]


def build_tables(
    acceptance_records: Sequence[Mapping[str, Any]],
    throughput_records: Sequence[Mapping[str, Any]],
    *,
    summaries: Sequence[Mapping[str, Any]] = (),
    positions: Sequence[int] = (0, 1, 2, 3),
    alpha: float = DEFAULT_ALPHA,
) -> dict[str, pd.DataFrame]:
    acceptance = acceptance_table(acceptance_records)
    return {
        "acceptance": acceptance,
        "accept_hist": accept_histogram(acceptance_records),
        "throughput": throughput_table(throughput_records),
        "stages": stage_table(acceptance_records),
        "speedup": speedup_table(acceptance),
        "greedy_match": greedy_match_table(acceptance_records),
        "sampling_test": sampling_test_table(acceptance_records, positions=positions, alpha=alpha),
        "acceptance_test": acceptance_test_table(acceptance_records, alpha=alpha),
        "machine_load": machine_load_table(summaries),
    }


def write_tables(tables: Mapping[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """Each table as parquet and CSV under out_dir; returns the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        for suffix in ("parquet", "csv"):
            path = out / f"{name}.{suffix}"
            if suffix == "parquet":
                frame.to_parquet(path, index=False)
            else:
                frame.to_csv(path, index=False)
            written.append(path)
    return written
