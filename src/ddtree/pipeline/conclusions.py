"""The report's header: warnings a reader must see first, and conclusions written from the data.

Everything here is computed from the tidy tables (results/tables/), and the conclusions text names
only numbers that `conclusions_table` holds, so a test can read both and compare them.

Speedup CIs: 95% percentile bootstrap over requests (ar's and the method's requests resampled
independently, `BOOTSTRAP` resamples, fixed seed), of the ratio of mean time per output token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

BOOTSTRAP = 2000
CI = 0.95
VARIANT_KEYS = ["variant", "temperature", "top_k", "top_p"]


def _exact(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "verifier" not in frame.columns:
        return frame
    return frame[frame["verifier"].fillna("exact") == "exact"]


def bootstrap_ratio(numerator: np.ndarray, denominator: np.ndarray, *, seed: int = 0) -> tuple[float, float]:
    """95% CI of mean(numerator) / mean(denominator), both resampled independently (nan if either is empty)."""
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size == 0 or b.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ratios = (rng.choice(a, (BOOTSTRAP, a.size)).mean(axis=1) / rng.choice(b, (BOOTSTRAP, b.size)).mean(axis=1))
    lo, hi = np.quantile(ratios, [(1 - CI) / 2, (1 + CI) / 2])
    return float(lo), float(hi)


def conclusions_table(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (pair, variant): the best exact ddtree budget by speedup over ar, its tau, expected tau, ms per
    token, speedup over ar and over dflash with 95% bootstrap CIs over requests, dflash's tau and speedup,
    and the target's mean per-token entropy at that variant."""
    speed, acc = _exact(tables.get("speedup", pd.DataFrame())), _exact(tables.get("acceptance", pd.DataFrame()))
    columns = ["pair", *VARIANT_KEYS, "best_budget", "ddtree_tau", "ddtree_expected_tau", "ddtree_ms_per_token",
               "ar_ms_per_token", "speedup_vs_ar", "speedup_vs_ar_lo", "speedup_vs_ar_hi", "dflash_tau",
               "dflash_speedup_vs_ar", "speedup_vs_dflash", "speedup_vs_dflash_lo", "speedup_vs_dflash_hi",
               "target_entropy"]
    if speed.empty or acc.empty:
        return pd.DataFrame(columns=columns)
    ok = acc[acc["error"].isna()]
    rows = []
    for (pair, variant), part in speed.groupby(["pair", "variant"], sort=False):
        ddtree = part[(part["method"] == "ddtree")].dropna(subset=["speedup"])
        if ddtree.empty:
            continue
        best = ddtree.loc[ddtree["speedup"].idxmax()]
        dflash = part[part["method"] == "dflash"]
        here = ok[(ok["pair"] == pair) & (ok["variant"] == variant)]
        tpot = {name: here[sel]["tpot"].to_numpy() for name, sel in (
            ("ar", here["method"] == "ar"), ("dflash", here["method"] == "dflash"),
            ("ddtree", (here["method"] == "ddtree") & (here["budget"] == best["budget"])))}
        lo, hi = bootstrap_ratio(tpot["ar"], tpot["ddtree"])
        dlo, dhi = bootstrap_ratio(tpot["dflash"], tpot["ddtree"], seed=1)
        dflash_tpot = float(np.nanmean(tpot["dflash"])) if tpot["dflash"].size else float("nan")
        entropy = here[here["method"] != "ar"]["mean_entropy"] if "mean_entropy" in here else pd.Series(dtype=float)
        rows.append({
            "pair": pair, **{k: best[k] for k in VARIANT_KEYS},
            "best_budget": int(best["budget"]), "ddtree_tau": float(best["tau"]),
            "ddtree_expected_tau": 1.0 + float(best["mean_expected_accept_len"]),
            "ddtree_ms_per_token": 1e3 * float(best["mean_tpot"]), "ar_ms_per_token": 1e3 * float(best["ar_mean_tpot"]),
            "speedup_vs_ar": float(best["speedup"]), "speedup_vs_ar_lo": lo, "speedup_vs_ar_hi": hi,
            "dflash_tau": float(dflash["tau"].iloc[0]) if len(dflash) else float("nan"),
            "dflash_speedup_vs_ar": float(dflash["speedup"].iloc[0]) if len(dflash) else float("nan"),
            "speedup_vs_dflash": dflash_tpot / float(best["mean_tpot"]) if len(dflash) else float("nan"),
            "speedup_vs_dflash_lo": dlo, "speedup_vs_dflash_hi": dhi,
            "target_entropy": float(entropy.mean()) if entropy.notna().any() else float("nan"),
        })
    return pd.DataFrame(rows, columns=columns)


def fmt(x: float, digits: int = 2) -> str:
    """The one number format of the conclusions (the test formats table values the same way)."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _variant_words(row: pd.Series) -> str:
    parts = [f"T = {fmt(float(row['temperature']), 1)}"]
    if int(row["top_k"]) > 0:
        parts.append(f"top-k {int(row['top_k'])}")
    if float(row["top_p"]) < 1.0:
        parts.append(f"top-p {fmt(float(row['top_p']), 2)}")
    return f"{row['variant']} ({', '.join(parts)})"


def crossover(table: pd.DataFrame) -> str:
    """Plain-temperature variants (no top-k / top-p): the lowest T where the best ddtree no longer beats ar."""
    plain = table[(table["top_k"].astype(int) <= 0) & (table["top_p"].astype(float) >= 1.0)]
    plain = plain.sort_values("temperature")
    if plain.empty:
        return "No plain-temperature variants ran: no crossover can be read."
    losing = plain[plain["speedup_vs_ar"] < 1.0]
    if losing.empty:
        return (f"Speculation pays at every temperature run (up to T = {fmt(float(plain['temperature'].max()), 1)}): "
                "no crossover in range.")
    first = losing.iloc[0]
    winning = plain[plain["temperature"] < first["temperature"]]
    last = f" (still {fmt(float(winning.iloc[-1]['speedup_vs_ar']))}x at T = " \
           f"{fmt(float(winning.iloc[-1]['temperature']), 1)})" if len(winning) else ""
    return (f"Crossover: from T = {fmt(float(first['temperature']), 1)} the best ddtree is slower than ar "
            f"({fmt(float(first['speedup_vs_ar']))}x){last}.")


@dataclass
class Header:
    warnings: list[str] = field(default_factory=list)
    conclusions: list[str] = field(default_factory=list)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


def pair_warnings(environment: pd.DataFrame, pairs: list[str]) -> list[str]:
    """A warning per pair whose manifest says it was not trained to its schedule (environment rows
    `pairs.<pair>.training.complete` / `.incomplete_reason`)."""
    if environment.empty:
        return ["No environment record: whether the pair was trained to its schedule is unknown."]
    values = dict(zip(environment["key"], environment["value"]))
    out = []
    for pair in pairs:
        complete = values.get(f"pairs.{pair}.training.complete")
        if complete == "false":
            reason = values.get(f"pairs.{pair}.training.incomplete_reason", "")
            out.append(f"The pair `{pair}` was NOT trained to its schedule ({reason.strip(chr(34))}): every number "
                       "below describes a weaker pair than the configured one.")
    return out


def error_warnings(tables: dict[str, pd.DataFrame]) -> list[str]:
    out = []
    acc = tables.get("acceptance", pd.DataFrame())
    if not acc.empty and acc["error"].notna().any():
        bad = acc[acc["error"].notna()]
        runs = ", ".join(sorted({f"{m}" + (f"-b{int(b)}" if b == b else "") for m, b in zip(bad["method"], bad["budget"])}))
        out.append(f"{len(bad)} of {len(acc)} acceptance requests failed ({runs}); they are excluded from every number.")
    thr = tables.get("throughput", pd.DataFrame())
    if not thr.empty and thr["errors"].sum() > 0:
        out.append(f"{int(thr['errors'].sum())} throughput requests failed; they are excluded.")
    return out


def lossless_summary(tables: dict[str, pd.DataFrame]) -> tuple[list[str], list[str]]:
    """(conclusion lines, warnings) of the losslessness tests of the exact verifiers and of the power panel."""
    lines, warnings = [], []
    match = _exact(tables.get("greedy_match", pd.DataFrame()))
    chi = tables.get("sampling_test", pd.DataFrame())
    z = tables.get("acceptance_test", pd.DataFrame())
    if not match.empty:
        lines.append(f"T = 0: {int(match['matches'].sum())} of {int(match['n'].sum())} speculative outputs equal "
                     f"ar's token for token (match rate {fmt(float(match['matches'].sum() / max(match['n'].sum(), 1)))}).")
    chi_exact, z_exact = _exact(chi), _exact(z)
    combined = chi_exact[chi_exact["position"] == -1] if not chi_exact.empty else chi_exact
    if not combined.empty:
        alpha = float(combined["alpha"].iloc[0])
        rejects = combined[combined["reject"]]
        lines.append(
            f"T > 0 token law (chi-square vs ar, independent samples, family-wise alpha = {fmt(alpha)}): "
            f"{len(combined) - len(rejects)} of {len(combined)} (run, variant) tests pass; power: each detects an "
            f"effect of Cohen's w = {fmt(float(combined['detectable_w'].median()))} (median over tests) with "
            "probability 0.9.")
        if len(rejects):
            warnings.append("The T > 0 token-law test REJECTS for " + ", ".join(
                f"{r.method}{'' if r.budget != r.budget else f'-b{int(r.budget)}'}/{r.variant}"
                for r in rejects.itertuples()) + f" at alpha = {fmt(alpha)}.")
    if not z_exact.empty:
        alpha = float(z_exact["alpha"].iloc[0])
        rejects = z_exact[z_exact["reject"]]
        lines.append(
            f"T > 0 acceptance (observed vs exact expected accepted drafts per round, z-test, alpha = {fmt(alpha)}): "
            f"{len(z_exact) - len(rejects)} of {len(z_exact)} tests pass, max |z| = {fmt(float(z_exact['z'].abs().max()))}; "
            f"power: each detects a bias of {fmt(float(z_exact['detectable_bias'].median()), 3)} drafts per round "
            "(median over tests) with probability 0.9.")
        if len(rejects):
            family_p = min(1.0, float(z_exact["p_value"].min()) * len(z_exact))
            warnings.append("The observed-vs-expected acceptance test REJECTS for " + ", ".join(
                f"{r.method}-b{int(r.budget)}/{r.variant}" if r.budget == r.budget else f"{r.method}/{r.variant}"
                for r in rejects.itertuples()) + f" at alpha = {fmt(alpha)} per test (Bonferroni over the "
                f"{len(z_exact)} tests: p = {fmt(family_p, 4)}; at alpha {fmt(alpha)} each, "
                f"{fmt(alpha * len(z_exact))} false rejections are expected among {len(z_exact)} lossless runs).")
    lossy_z = z[z["verifier"] != "exact"] if not z.empty else z
    lossy_chi = chi[(chi["verifier"] != "exact") & (chi["position"] == -1)] if not chi.empty else chi
    for name in sorted(set(lossy_z.get("verifier", [])) | set(lossy_chi.get("verifier", []))):
        zr, cr = lossy_z[lossy_z["verifier"] == name], lossy_chi[lossy_chi["verifier"] == name]
        caught = bool(zr["reject"].any()) or bool(cr["reject"].any())
        lines.append(
            f"Power panel: the deliberately lossy verifier `{name}` is {'REJECTED' if caught else 'NOT rejected'} "
            f"(z = {fmt(float(zr['z'].abs().max())) if len(zr) else 'n/a'}, token-law p = "
            f"{fmt(float(cr['p_value'].min()), 4) if len(cr) else 'n/a'}).")
    return lines, warnings


def load_warnings(tables: dict[str, pd.DataFrame]) -> list[str]:
    """A warning when a run was timed with more runnable processes than cores (1-minute load average above the
    core count at the end of a timed phase): its times per token, and every speedup built on them, are inflated."""
    frame = tables.get("machine_load", pd.DataFrame())
    if frame.empty:
        return []
    busy = frame[frame["load_max"] > frame["cpus"]]
    if busy.empty:
        return []
    runs = ", ".join(sorted({f"{m}" + (f"-b{int(b)}" if b == b else "") + ("" if v == "exact" else f" ({v})")
                             for m, b, v in zip(busy["method"], busy["budget"], busy["verifier"])}))
    worst = busy.loc[busy["load_max"].idxmax()]
    return [f"The machine was busy while {len(busy)} of {len(frame)} runs were timed ({runs}): the 1-minute load "
            f"average reached {worst['load_max']:.1f} on {int(worst['cpus'])} cores. Times per token and the "
            "speedups may be inflated, and unevenly between runs; tau, acceptance and the losslessness tests do not "
            "depend on load. Rerun on a quiet machine to compare speeds."]


def header(tables: dict[str, pd.DataFrame], environment: pd.DataFrame) -> Header:
    """Warnings and conclusions of one profile's report."""
    table = conclusions_table(tables)
    pairs = sorted(set(tables.get("acceptance", pd.DataFrame()).get("pair", [])))
    out = Header(table=table)
    out.warnings += pair_warnings(environment, pairs) + error_warnings(tables) + load_warnings(tables)
    for row in table.itertuples(index=False):
        r = pd.Series(row._asdict())
        vs_dflash = "" if math.isnan(r["speedup_vs_dflash"]) else (
            f", {fmt(r['speedup_vs_dflash'])}x over dflash [{fmt(r['speedup_vs_dflash_lo'])}-"
            f"{fmt(r['speedup_vs_dflash_hi'])}]")
        dflash_tau = "" if math.isnan(r["dflash_tau"]) else f" (dflash {fmt(r['dflash_tau'])})"
        entropy = "" if math.isnan(r["target_entropy"]) else f"; target entropy {fmt(r['target_entropy'])} nats/token"
        out.conclusions.append(
            f"**{_variant_words(r)}**: best ddtree budget {int(r['best_budget'])}, **{fmt(r['speedup_vs_ar'])}x** over "
            f"ar [95% CI {fmt(r['speedup_vs_ar_lo'])}-{fmt(r['speedup_vs_ar_hi'])}]{vs_dflash}; tau "
            f"{fmt(r['ddtree_tau'])}{dflash_tau}; {fmt(r['ddtree_ms_per_token'])} vs {fmt(r['ar_ms_per_token'])} ms "
            f"per token (ar){entropy}.")
    if not table.empty:
        out.conclusions.append(crossover(table))
    lines, warnings = lossless_summary(tables)
    out.conclusions += lines
    out.warnings += warnings
    return out


def header_markdown(h: Header) -> str:
    parts = []
    for w in h.warnings:
        parts.append(f'<div style="border:2px solid #c00;background:#fee;padding:6px 10px;margin:6px 0">'
                     f"<b>Warning:</b> {w}</div>")
    if h.conclusions:
        parts.append("## Conclusions\n\n" + "\n".join(f"- {line}" for line in h.conclusions))
    else:
        parts.append("## Conclusions\n\nNo speedup against ar could be computed from these tables.")
    return "\n\n".join(parts)
