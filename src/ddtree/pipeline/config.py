"""Experiment configuration helpers: run ids, cross-reference checks, benchmark plans.

The JSON schemas in `workflow/schemas/` check keys and types; what a schema cannot
express (a name that must refer to another section, a profile file that must exist)
is checked here so that the workflow fails at parse time with a message naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from ddtree.bench.schema import (
    AcceptancePhase,
    BenchPlan,
    PlanOutputs,
    ServerSpec,
    SglangBenchPhase,
    ThroughputPhase,
)
from ddtree.engine.types import METHODS

METHODS_WITH_BUDGET = ("ddtree",)
# The tidy tables under results/tables/ (the aggregate job writes all but `environment`; the report reads them all).
TABLE_NAMES = ("acceptance", "accept_hist", "throughput", "stages", "speedup", "greedy_match", "sampling_test",
               "acceptance_test", "machine_load", "environment")
_RUN_ID = re.compile(rf"^({'|'.join(METHODS)})(?:-b(\d+))?$")
# A power-panel run: ddtree under a deliberately lossy verifier (ddtree.core.lossy_verifiers), e.g.
# `ddtree-b16-lossy-greedy_accept`; it runs the acceptance phase only, on `lossless.power_panel.variants`.
_LOSSY_RUN = re.compile(r"^(ddtree-b\d+)-lossy-([a-z_]+)$")


def run_id(method: str, budget: int | None) -> str:
    """Directory name of one (method, budget) benchmark: `ar`, `dflash`, `ddtree-b64`."""
    if method in METHODS_WITH_BUDGET:
        if budget is None or int(budget) < 1:
            raise ValueError(f"budget must be a positive integer for method {method!r}, got {budget!r}")
        return f"{method}-b{int(budget)}"
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    return method


def lossy_run_id(budget: int, verifier: str) -> str:
    return f"{run_id('ddtree', budget)}-lossy-{verifier}"


def run_verifier(run: str) -> str:
    """The sampling verifier of a run: "exact", or the lossy verifier of a power-panel run."""
    match = _LOSSY_RUN.match(run)
    return match.group(2) if match else "exact"


def parse_run_id(run: str) -> tuple[str, int | None]:
    """Inverse of `run_id` (a power-panel run parses as its ddtree run)."""
    lossy = _LOSSY_RUN.match(run)
    match = _RUN_ID.match(lossy.group(1) if lossy else run)
    if match is None:
        names = [f"{m}-b<budget>" if m in METHODS_WITH_BUDGET else m for m in METHODS]
        raise ValueError(f"run id {run!r} is not {', '.join(names[:-1])} or {names[-1]}")
    method, budget = match.group(1), match.group(2)
    if (method in METHODS_WITH_BUDGET) != (budget is not None):
        raise ValueError(f"run id {run!r}: only ddtree carries a budget")
    return method, (int(budget) if budget is not None else None)


def run_ids(methods: Sequence[str], budgets: Sequence[int]) -> list[str]:
    """Every benchmark run: ar and dflash once, ddtree once per budget (never multiplied)."""
    runs: list[str] = []
    for method in methods:
        if method in METHODS_WITH_BUDGET:
            runs.extend(run_id(method, b) for b in sorted(set(int(b) for b in budgets)))
        else:
            runs.append(run_id(method, None))
    return runs


def power_panel_runs(config: Mapping[str, Any]) -> list[str]:
    """The power panel's runs (`lossless.power_panel`): one per lossy verifier, none when it is off."""
    panel = config.get("lossless", {}).get("power_panel") or {}
    if not panel.get("verifiers") or "ddtree" not in config["methods"]:
        return []
    return [lossy_run_id(int(panel["budget"]), name) for name in panel["verifiers"]]


def variant_by_name(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    for variant in config["variants"]:
        if variant["name"] == name:
            return dict(variant)
    raise ValueError(f"variant {name!r} is not defined under 'variants'")


def check_references(config: Mapping[str, Any], available_profiles: Sequence[str]) -> None:
    """Raise ValueError naming the first dangling reference of a schema-valid config."""
    for profile in config["hardware"]:
        if profile not in available_profiles:
            raise ValueError(
                f"hardware profile {profile!r} is unknown: no config/hardware/{profile}.yaml "
                f"(available: {', '.join(sorted(available_profiles)) or 'none'})"
            )
    for pair in config["pairs"]:
        if pair not in config["model_pairs"]:
            raise ValueError(f"pairs: {pair!r} is not defined under 'model_pairs'")
    for dataset in config["datasets"]:
        if dataset not in config["dataset_catalog"]:
            raise ValueError(f"datasets: {dataset!r} is not defined under 'dataset_catalog'")
    names = [v["name"] for v in config["variants"]]
    if len(set(names)) != len(names):
        raise ValueError(f"variants: names must be unique, got {names}")
    for name in config["acceptance"]["variants"]:
        if name not in names:
            raise ValueError(f"acceptance.variants: {name!r} is not defined under 'variants'")
    if config["throughput"]["variant"] not in names:
        raise ValueError(f"throughput.variant: {config['throughput']['variant']!r} is not defined under 'variants'")
    if "ddtree" in config["methods"] and not config["budgets"]:
        raise ValueError("budgets: ddtree is among the methods, so at least one budget is needed")
    panel = config.get("lossless", {}).get("power_panel") or {}
    if panel.get("verifiers"):
        from ddtree.core.lossy_verifiers import LOSSY_VERIFIERS

        for name in panel["verifiers"]:
            if name not in LOSSY_VERIFIERS:
                raise ValueError(f"lossless.power_panel.verifiers: {name!r} is not one of {list(LOSSY_VERIFIERS)}")
        for name in panel.get("variants", []):
            if name not in names:
                raise ValueError(f"lossless.power_panel.variants: {name!r} is not defined under 'variants'")


def profile_pairs(
    pairs: Sequence[str], profile_name: str, profile: Mapping[str, Any], model_pairs: Mapping[str, Any]
) -> list[str]:
    """The model pairs a hardware profile benchmarks: the configured `pairs`, each replaced by the profile's
    `replace_pairs` entry if it has one (config order, no duplicates)."""
    replace = dict(profile.get("replace_pairs") or {})
    for old, new in replace.items():
        if new not in model_pairs:
            raise ValueError(f"hardware profile {profile_name!r}: replace_pairs {old!r} -> {new!r}: {new!r} is not "
                             f"defined under 'model_pairs'")
    out: list[str] = []
    for pair in pairs:
        chosen = replace.get(pair, pair)
        if chosen not in out:
            out.append(chosen)
    return out


def train_profile(pair_name: str, pair: Mapping[str, Any], available_profiles: Sequence[str]) -> str:
    """The hardware profile whose device and resources train an embedded pair (`train_profile`, default cpu)."""
    name = pair.get("train_profile") or "cpu"
    if name not in available_profiles:
        raise ValueError(f"model_pairs: {pair_name!r}: train_profile {name!r} is unknown: no config/hardware/"
                         f"{name}.yaml")
    return name


def check_hardware_profile(name: str, profile: Mapping[str, Any]) -> None:
    """Semantic checks a schema cannot express."""
    if profile["engine"] == "reference" and int(profile["tensor_parallel_size"]) != 1:
        raise ValueError(f"hardware profile {name!r}: tensor_parallel_size must be 1 for the reference engine")
    gpus = int(profile["resources"]["gpus"])
    if profile["device"].startswith("cuda") and gpus < int(profile["tensor_parallel_size"]):
        raise ValueError(
            f"hardware profile {name!r}: resources.gpus ({gpus}) is below tensor_parallel_size "
            f"({profile['tensor_parallel_size']})"
        )


def sglang_check_command(profile: Mapping[str, Any], pair_dir: str, budget: int) -> str:
    """The one command to run first on an SGLang GPU host: the DDTREE plugin end to end on one pair
    (`ddtree.sglang.check`: DDTREE and plain decoding servers, greedy outputs compared, tau reported)."""
    args = " ".join(server_extra_args(profile))
    return f"python -m ddtree.sglang.check --model {pair_dir} --budget {int(budget)} -- {args}".rstrip(" -")


def server_extra_args(profile: Mapping[str, Any]) -> list[str]:
    """Server arguments of a profile; the tensor-parallel size is set once, in the profile."""
    args = [str(a) for a in profile.get("server_args", [])]
    tp = int(profile["tensor_parallel_size"])
    if profile["engine"] == "sglang" and tp > 1 and "--tp-size" not in args:
        args += ["--tp-size", str(tp)]
    return args


def build_plan(
    config: Mapping[str, Any],
    profile_name: str,
    profile: Mapping[str, Any],
    pair: str,
    run: str,
    *,
    model_dir: str,
    prompts: str,
    num_prompts: int,
    out_dir: str,
    server_log: str,
) -> BenchPlan:
    """The `ddtree bench session` plan for one benchmark run."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_prompts}")
    method, budget = parse_run_id(run)
    verifier = run_verifier(run)
    out = Path(out_dir)
    acceptance = config["acceptance"]
    throughput = config["throughput"]
    # ar and dflash ignore the budget; the server still gets a valid integer.
    server_budget = budget if budget is not None else int(min(config["budgets"] or [1]))
    extra_args = server_extra_args(profile) + (["--verifier", verifier] if verifier != "exact" else [])
    lossy = verifier != "exact"  # a power-panel run measures acceptance only, on the panel's variants
    variants = config["lossless"]["power_panel"]["variants"] if lossy else acceptance["variants"]
    phase = ThroughputPhase(
        concurrency=tuple(int(c) for c in throughput["concurrency"]),
        num_requests=int(throughput["num_requests"]),
        max_new_tokens=int(throughput["max_new_tokens"]),
        variant=variant_by_name(config, throughput["variant"]),
    )
    # SGLang's own client on the throughput phase's requests (skipped where sglang is not installed)
    sglang_bench = throughput.get("sglang_bench_serving", False)
    records = out / "records"
    return BenchPlan(
        server=ServerSpec(
            engine=profile["engine"],
            model=str(model_dir),
            method=method,
            budget=server_budget,
            device=profile["device"],
            dtype=profile["dtype"],
            extra_args=tuple(extra_args),
            health_timeout_s=int(profile["health_timeout_s"]),
            log=str(server_log),
        ),
        prompts=str(prompts),
        acceptance=AcceptancePhase(
            variants=tuple(variant_by_name(config, name) for name in variants),
            num_prompts=int(num_prompts),
            max_new_tokens=int(acceptance["max_new_tokens"]),
            samples_per_prompt=int(acceptance["samples_per_prompt"]),
            # the run id enters every request seed: ar and each speculative run draw independent samples
            seed_salt=run,
        ),
        throughput=None if lossy else phase,
        sglang_bench=SglangBenchPhase(concurrency=phase.concurrency, num_prompts=phase.num_requests,
                                      output_len=phase.max_new_tokens, variant=phase.variant) if sglang_bench else None,
        tags={"profile": profile_name, "pair": pair, "method": method, "budget": budget, "verifier": verifier},
        # Records and the session's own summary (written however the session ends) are not Snakemake outputs: a
        # failed or killed job keeps them and the rerun resumes. The workflow copies the summary to summary.json
        # only when the session succeeded.
        out=PlanOutputs(
            acceptance=str(records / "acceptance.jsonl"),
            throughput=str(records / "throughput.jsonl"),
            sglang_bench=str(records / "sglang_bench.jsonl") if sglang_bench else None,
            summary=str(records / "session.json"),
        ),
    )


def plan_fingerprint(plan: BenchPlan, model_manifest: str | Path) -> str:
    """Hash of what the records depend on: the plan and the model pair's manifest."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(plan.to_json(), sort_keys=True).encode())
    manifest = Path(model_manifest)
    digest.update(manifest.read_bytes() if manifest.is_file() else b"")
    return digest.hexdigest()


def reset_stale_records(plan: BenchPlan, fingerprint: str) -> list[str]:
    """Delete record files written for another plan or model; keep them (resume) otherwise.

    The fingerprint is stored beside the records; returns the paths that were removed.
    """
    out = plan.out
    records = [Path(p) for p in (out.acceptance, out.throughput, out.sglang_bench) if p is not None]
    stamp = records[0].parent / "fingerprint.txt" if records else Path(out.summary).parent / "fingerprint.txt"
    previous = stamp.read_text().strip() if stamp.is_file() else None
    removed: list[str] = []
    if previous != fingerprint:
        for path in records:
            if path.exists():
                path.unlink()
                removed.append(str(path))
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint + "\n")
    return removed
