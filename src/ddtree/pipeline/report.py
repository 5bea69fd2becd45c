"""Figures and tables of the papermill reports (notebooks/ stay thin and call these).

Every figure function returns a `Panel`: the seaborn figure (or None), the table of the
numbers behind it, and a note that says what is missing when data are absent, so the
report shows a visible note instead of failing (e.g. a profile run with one budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ddtree.engine.types import METHODS, STAGES
from ddtree.pipeline.conclusions import _exact
from ddtree.pipeline.config import TABLE_NAMES



@dataclass
class Panel:
    title: str
    figure: Any = None  # matplotlib Figure
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)


def load_tables(tables_dir: str | Path, profile: str | None = None) -> dict[str, pd.DataFrame]:
    """Read every table (parquet); filter to one hardware profile when given. Missing -> empty."""
    tables = {}
    for name in TABLE_NAMES:
        path = Path(tables_dir) / f"{name}.parquet"
        frame = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
        if profile is not None and "profile" in frame.columns:
            frame = frame[frame["profile"] == profile].reset_index(drop=True)
        tables[name] = frame
    return tables


def run_label(method: str, budget: float | None) -> str:
    if budget is None or (isinstance(budget, float) and math.isnan(budget)):
        return str(method)
    return f"{method}-b{int(budget)}"


def _with_run(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["run"] = [run_label(m, b) for m, b in zip(frame["method"], frame["budget"])]
    return frame


def _run_order(frame: pd.DataFrame) -> list[str]:
    runs = frame[["method", "budget", "run"]].drop_duplicates()
    rank = {method: i for i, method in enumerate(METHODS)}
    runs = runs.assign(_m=runs["method"].map(rank).fillna(3), _b=runs["budget"].fillna(-1))
    return list(runs.sort_values(["_m", "_b"])["run"])


def _plt():
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def speedup_tau_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    """Speedup over ar and tau against the ddtree budget, one line per sampling variant;
    dflash as dashed lines at its (budget-free) value."""
    panel = Panel("Speedup and tau vs budget")
    speed = tables.get("speedup", pd.DataFrame())
    if speed.empty:
        panel.notes.append("No acceptance records: speedup and tau cannot be shown.")
        return panel
    speed = _with_run(speed)
    # `ar` commits one token a forward: its tau is 1 by definition (the records leave it empty)
    speed["tau"] = speed["tau"].where(speed["method"] != "ar", speed["tau"].fillna(1.0))
    # one row per run, one column pair per variant: tau and speedup (ms per token in the sweep panel)
    wide = speed.pivot_table(index="run", columns="variant", values=["speedup", "tau"], sort=False)
    wide = wide.reindex([r for r in _run_order(speed) if r in wide.index])
    wide.columns = [f"{metric} {variant}" for metric, variant in wide.columns]
    panel.table = wide.reset_index()
    if speed["ar_mean_tpot"].isna().all():
        panel.notes.append("No ar baseline in these runs: speedup is undefined (tau is still shown).")
    ddtree = speed[speed["method"] == "ddtree"]
    if ddtree["budget"].nunique() < 2:
        panel.notes.append(f"Only {ddtree['budget'].nunique()} ddtree budget(s) ran: the budget axis has one point.")
    plt, sns = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    variants = list(dict.fromkeys(speed["variant"]))
    palette = dict(zip(variants, sns.color_palette(n_colors=max(len(variants), 1))))
    for ax, metric in zip(axes, ("speedup", "tau")):
        if not ddtree.empty:
            sns.lineplot(data=ddtree, x="budget", y=metric, hue="variant", palette=palette, marker="o",
                         errorbar=None, ax=ax)
        for variant, part in speed[speed["method"] == "dflash"].groupby("variant"):
            ax.axhline(part[metric].mean(), ls="--", color=palette.get(variant), alpha=0.8)
        if metric == "speedup":
            ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{metric} (ddtree lines; dflash dashed)")
    # one legend for both plots, beside them: inside, it hid the lines it names
    if axes[0].get_legend() is not None:
        axes[0].get_legend().remove()
    if axes[1].get_legend() is not None:
        sns.move_legend(axes[1], "upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    panel.figure = fig
    return panel


def temperature_sweep_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    """tau, expected tau and speedup over ar against the temperature (best ddtree budget per variant and
    dflash), and the target's per-token entropy at each variant; top-k / top-p variants as separate points."""
    from ddtree.pipeline.conclusions import conclusions_table

    panel = Panel("Temperature sweep")
    table = conclusions_table(tables)
    if table.empty:
        panel.notes.append("No ddtree speedup against ar: no temperature sweep.")
        return panel
    table = table.sort_values(["temperature", "variant"])
    panel.table = table[["variant", "temperature", "top_k", "top_p", "target_entropy", "best_budget", "ddtree_tau",
                         "ddtree_expected_tau", "dflash_tau", "ddtree_ms_per_token", "ar_ms_per_token",
                         "speedup_vs_ar", "dflash_speedup_vs_ar"]].rename(columns={
        "target_entropy": "entropy (nats)", "best_budget": "budget", "ddtree_tau": "tau", "ddtree_expected_tau": "1 + E[accepted]",
        "ddtree_ms_per_token": "ms/token", "ar_ms_per_token": "ar ms/token", "speedup_vs_ar": "speedup",
        "dflash_speedup_vs_ar": "dflash speedup"})
    if table["temperature"].nunique() < 3:
        panel.notes.append(f"Only {table['temperature'].nunique()} temperature(s) ran: the sweep is thin.")
    plt, _ = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    plain = (table["top_k"].astype(int) <= 0) & (table["top_p"].astype(float) >= 1.0)
    for ax, (metric, dflash, title) in zip(axes, (
            ("speedup_vs_ar", "dflash_speedup_vs_ar", "speedup over ar (best budget)"),
            ("ddtree_tau", "dflash_tau", "tau (o; x: 1 + exact E[accepted drafts])"),
            ("target_entropy", None, "target entropy per token (nats)"))):
        ax.plot(table[plain]["temperature"], table[plain][metric], marker="o", label="ddtree")
        if metric == "ddtree_tau":
            ax.plot(table[plain]["temperature"], table[plain]["ddtree_expected_tau"], marker="x", ls=":",
                    label="ddtree expected")
        if dflash:
            ax.plot(table[plain]["temperature"], table[plain][dflash], marker="o", ls="--", label="dflash")
        for row in table[~plain].itertuples():
            ax.scatter([row.temperature], [getattr(row, metric)], marker="s", color="black")
            ax.annotate(row.variant, (row.temperature, getattr(row, metric)), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")
        if metric == "speedup_vs_ar":
            ax.axhline(1.0, color="black", lw=0.8)
        ax.set(xlabel="temperature", title=title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    panel.figure = fig
    return panel


def accept_hist_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    """Per-round accept-length distribution, greedy vs sampled, for dflash and the largest ddtree budget."""
    panel = Panel("Accept-length distribution, greedy vs sampled")
    hist = tables.get("accept_hist", pd.DataFrame())
    hist = hist[hist["method"].isin(["dflash", "ddtree"])] if not hist.empty else hist
    if hist.empty:
        panel.notes.append("No speculative rounds recorded: no accept-length distribution.")
        return panel
    hist = _with_run(hist)
    largest = hist[hist["method"] == "ddtree"]["budget"].max()
    keep = hist[(hist["method"] == "dflash") | (hist["budget"] == largest)]
    # one row per (run, variant), one column per accepted length: the fraction of rounds
    wide = keep.pivot_table(index=["run", "variant"], columns="accept_len", values="fraction", fill_value=0.0)
    wide.columns = [f"{int(c)}" for c in wide.columns]
    panel.table = wide.reset_index()
    plt, sns = _plt()
    runs = _run_order(keep)
    # One variant order (greedy first, then by temperature) so colours agree across panels.
    variants = list(keep.sort_values(["temperature", "variant"])["variant"].drop_duplicates())
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        sns.barplot(data=keep[keep["run"] == run], x="accept_len", y="fraction", hue="variant",
                    hue_order=variants, ax=ax, errorbar=None)
        ax.set_title(f"{run}: accepted drafts per round")
    fig.tight_layout()
    panel.figure = fig
    return panel


def observed_expected_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    """Mean accepted drafts per round against the exact expectation from the verify logits."""
    panel = Panel("Observed vs expected acceptance")
    acc = tables.get("acceptance", pd.DataFrame())
    if not acc.empty:
        acc = acc[acc["method"].isin(["dflash", "ddtree"]) & acc["error"].isna()]
        acc = acc.dropna(subset=["mean_accept_len", "mean_expected_accept_len"])
    if acc.empty:
        panel.notes.append("No expected accept lengths recorded.")
        return panel
    acc = _with_run(acc)
    panel.table = (acc.groupby(["pair", "run", "variant"], dropna=False)
                   .agg(requests=("prompt_id", "size"), observed=("mean_accept_len", "mean"),
                        expected=("mean_expected_accept_len", "mean")).reset_index())
    plt, sns = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(data=acc, x="mean_expected_accept_len", y="mean_accept_len", hue="variant", style="run", ax=ax)
    hi = float(np.nanmax(acc[["mean_accept_len", "mean_expected_accept_len"]].to_numpy())) * 1.05 + 1e-9
    ax.plot([0, hi], [0, hi], color="black", lw=0.8)
    ax.set(xlabel="expected accepted drafts / round", ylabel="observed accepted drafts / round",
           title="per request (line: observed = expected)")
    fig.tight_layout()
    panel.figure = fig
    return panel


def throughput_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    panel = Panel("Throughput and latency vs concurrency")
    thr = tables.get("throughput", pd.DataFrame())
    if thr.empty:
        panel.notes.append("No throughput records.")
        return panel
    thr = _with_run(thr)
    panel.table = pd.DataFrame({
        "run": thr["run"], "concurrency": thr["concurrency"], "requests": thr["requests"], "errors": thr["errors"],
        "tokens/s": thr["output_tok_per_s"], "p50 latency ms": 1e3 * thr["p50_e2e_latency"],
        "p90 latency ms": 1e3 * thr["p90_e2e_latency"], "ttft ms": 1e3 * thr["mean_ttft"],
        "ms/token": 1e3 * thr["mean_tpot"]})
    if thr["concurrency"].nunique() < 2:
        panel.notes.append("Only one concurrency level ran.")
    if thr["errors"].sum() > 0:
        panel.notes.append(f"{int(thr['errors'].sum())} throughput request(s) failed; they are excluded.")
    plt, sns = _plt()
    order = _run_order(thr)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    sns.lineplot(data=thr, x="concurrency", y="output_tok_per_s", hue="run", hue_order=order, marker="o",
                 ax=axes[0], errorbar=None)
    sns.lineplot(data=thr, x="concurrency", y="p50_e2e_latency", hue="run", hue_order=order, marker="o",
                 ax=axes[1], errorbar=None)
    axes[0].set_title("output tokens / s")
    axes[1].set_title("median end-to-end latency (s)")
    fig.tight_layout()
    panel.figure = fig
    return panel


def stages_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    panel = Panel("Per-stage time per round")
    stages = tables.get("stages", pd.DataFrame())
    if stages.empty:
        panel.notes.append("No per-stage times recorded.")
        return panel
    if not (stages["seconds"] > 0).any():
        panel.notes.append("No per-stage times recorded: the servers ran without stage timing (`ddtree serve "
                           "--stage-times`: off by default on CUDA, where timing each stage synchronises the device; "
                           "add `--stage-times on` to the hardware profile's server arguments to record them).")
        return panel
    stages = _with_run(stages)
    per_run = (stages.groupby(["run", "stage"], dropna=False)
               .agg(seconds=("seconds", "sum"), rounds=("rounds", "sum")).reset_index())
    per_run["ms_per_round"] = 1e3 * per_run["seconds"] / per_run["rounds"].replace(0, np.nan)
    counted = per_run.groupby("run")["rounds"].sum()
    if (counted == 0).any():  # `ar` reports no speculative rounds (SGLang's spec_verify_ct is empty for it)
        panel.notes.append(f"Left out (no speculative rounds to divide by): {', '.join(counted.index[counted == 0])}.")
        per_run = per_run[per_run["run"].isin(counted.index[counted > 0])]
    wide = per_run.pivot(index="run", columns="stage", values="ms_per_round").fillna(0.0)
    wide = wide.reindex(index=[r for r in _run_order(stages) if r in wide.index],
                        columns=[s for s in STAGES if s in wide.columns] +
                        [s for s in wide.columns if s not in STAGES])
    panel.table = wide.assign(total=wide.sum(axis=1)).rename_axis(columns=None).reset_index()  # ms per round
    plt, _ = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    wide.plot(kind="bar", stacked=True, ax=ax)
    ax.legend(title="stage", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    ax.set(ylabel="ms per round", xlabel="", title="stage breakdown (all variants)")
    fig.tight_layout()
    panel.figure = fig
    return panel


def _run_with_verifier(frame: pd.DataFrame) -> pd.DataFrame:
    frame = _with_run(frame)
    verifier = frame["verifier"].fillna("exact") if "verifier" in frame else pd.Series("exact", index=frame.index)
    frame["run"] = [run if v == "exact" else f"{run} LOSSY:{v}" for run, v in zip(frame["run"], verifier)]
    return frame


def lossless_panel(tables: dict[str, pd.DataFrame]) -> Panel:
    """T = 0 match rate against ar; T > 0 token-law chi-square (vs ar) and observed-vs-expected acceptance
    z-test, for the exact runs and the power panel's deliberately lossy runs (labelled LOSSY)."""
    panel = Panel("Losslessness (with the power panel)")
    match = _exact(tables.get("greedy_match", pd.DataFrame()))
    test = tables.get("sampling_test", pd.DataFrame())
    ztest = tables.get("acceptance_test", pd.DataFrame())
    if match.empty:
        panel.notes.append("No T = 0 comparison against ar (ar or a greedy variant did not run).")
    if test.empty:
        panel.notes.append("No T > 0 comparison against ar (ar or a sampled variant did not run).")
    if match.empty and test.empty and ztest.empty:
        return panel
    if not ztest.empty and not (ztest["verifier"] != "exact").any():
        panel.notes.append("The power panel did not run (lossless.power_panel.verifiers is empty): the tests' "
                           "power is stated below but not shown on a lossy verifier.")
    plt, sns = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    parts = []
    if not match.empty:
        match = _with_run(match)
        sns.barplot(data=match, x="run", y="match_rate", ax=axes[0], errorbar=None, color="tab:blue")
        axes[0].set(ylim=(0, 1.05), title="T = 0: output identical to ar (by prompt)", xlabel="")
        parts.append(pd.DataFrame({"test": "T=0 match", "run": match["run"], "variant": match["variant"],
                                   "n": match["n"], "value": match["match_rate"], "reject": False,
                                   "power": "exact identity (float32)"}))
    if not test.empty:
        test = _run_with_verifier(test)
        combined = test[test["position"] == -1].copy()
        alpha = float(combined["alpha"].iloc[0]) if len(combined) else float("nan")
        combined["neg_log10_p"] = -np.log10(combined["p_value"].clip(lower=1e-300))
        sns.barplot(data=combined, x="neg_log10_p", y="run", hue="variant", ax=axes[1], errorbar=None, orient="h")
        axes[1].axvline(-math.log10(alpha), color="red", ls="--", label=f"alpha = {alpha}")
        axes[1].set(title="T > 0 token law vs ar: -log10 Bonferroni p", ylabel="", xlabel="right of red = reject")
        parts.append(pd.DataFrame({
            "test": "T>0 token law (chi-square)", "run": combined["run"], "variant": combined["variant"],
            "n": combined["n_a"].astype(int).astype(str) + " vs " + combined["n_b"].astype(int).astype(str),
            "value": combined["p_value"], "reject": combined["reject"],
            "power": [f"w = {x:.2f} w.p. 0.9" for x in combined["detectable_w"]]}))
    if not ztest.empty:
        ztest = _run_with_verifier(ztest)
        alpha = float(ztest["alpha"].iloc[0])
        from scipy.stats import norm

        ztest["abs_z"] = ztest["z"].abs().clip(upper=50)
        sns.barplot(data=ztest, x="abs_z", y="run", hue="variant", ax=axes[2], errorbar=None, orient="h")
        axes[2].axvline(norm.isf(alpha / 2), color="red", ls="--", label=f"alpha = {alpha}")
        axes[2].set(title="T > 0 observed vs expected acceptance: |z|", ylabel="", xlabel="right of red = reject")
        parts.append(pd.DataFrame({
            "test": "T>0 acceptance (z)", "run": ztest["run"], "variant": ztest["variant"],
            "n": ztest["rounds"].astype(int).astype(str) + " rounds", "value": ztest["z"], "reject": ztest["reject"],
            "power": [f"bias {x:.3f}/round w.p. 0.9" for x in ztest["detectable_bias"]]}))
    for ax in axes[1:]:
        if ax.get_legend() is not None:
            ax.legend(fontsize=8)
    fig.tight_layout()
    panel.figure = fig
    panel.table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return panel


def exact_runs(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The tables without the power panel's lossy runs (they appear in the losslessness panel only)."""
    return {name: _exact(frame) for name, frame in tables.items()}


def profile_panels(tables: dict[str, pd.DataFrame]) -> list[Panel]:
    exact = exact_runs(tables)
    return [speedup_tau_panel(exact), temperature_sweep_panel(exact), accept_hist_panel(exact),
            observed_expected_panel(exact), throughput_panel(exact), stages_panel(exact), lossless_panel(tables)]


def hardware_summary(tables: dict[str, pd.DataFrame]) -> Panel:
    """Across profiles: the best ddtree budget per (profile, pair, variant) against dflash."""
    panel = Panel("Across hardware: best budget per profile")
    speed = _exact(tables.get("speedup", pd.DataFrame()))
    if speed.empty:
        panel.notes.append("No acceptance records in any profile.")
        return panel
    speed = _with_run(speed)
    keys = ["profile", "pair", "variant"]
    dd = speed[speed["method"] == "ddtree"].dropna(subset=["speedup"])
    best = dd.loc[dd.groupby(keys)["speedup"].idxmax()] if not dd.empty else dd
    dflash = speed[speed["method"] == "dflash"][keys + ["speedup", "tau"]].rename(
        columns={"speedup": "dflash_speedup", "tau": "dflash_tau"})
    table = best[keys + ["budget", "speedup", "tau"]].merge(dflash, on=keys, how="outer")
    panel.table = table
    if table.empty or table["speedup"].isna().all():
        panel.notes.append("No ddtree speedup against ar is available.")
        return panel
    if table["profile"].nunique() < 2:
        panel.notes.append("Only one hardware profile has results.")
    plt, sns = _plt()
    long = table.melt(id_vars=keys, value_vars=["speedup", "dflash_speedup"], var_name="method",
                      value_name="x_over_ar").replace({"speedup": "ddtree (best budget)", "dflash_speedup": "dflash"})
    grid = sns.catplot(data=long, x="profile", y="x_over_ar", hue="method", col="variant", kind="bar",
                       errorbar=None, height=3.6, aspect=1.0)
    grid.set_titles("{col_name}")
    grid.set_axis_labels("hardware profile", "speedup over ar")
    panel.figure = grid.figure
    return panel


def figure_png(figure: Any, dpi: int = 110) -> bytes:
    """PNG bytes of a figure, which is then closed (works under any matplotlib backend)."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def show(panel: Panel) -> None:
    """Notebook display: heading, notes, figure, then the table of the numbers behind it."""
    from IPython.display import Image, Markdown, display

    display(Markdown(f"## {panel.title}"))
    for note in panel.notes:
        display(Markdown(f"> **Note:** {note}"))
    if panel.figure is not None:
        display(Image(data=figure_png(panel.figure)))
    if not panel.table.empty:
        display(panel.table.round(4).reset_index(drop=True))
