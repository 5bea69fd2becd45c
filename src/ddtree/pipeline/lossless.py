"""Losslessness statistics: speculative decoding must not change what the target emits.

T = 0: the speculative output of a prompt must equal autoregressive decoding's (exactly in
float32; in bf16 near-ties can flip), so we report the match rate by prompt.

T > 0: each emitted token is an exact sample of the target given the emitted prefix, so the
token at a fixed output position j, one per (prompt, sample), has the same law under both
methods when the prompts are the same. Sequences are independent (distinct seeds), tokens
within one sequence are not, so we test one position at a time: a chi-square test of
homogeneity on the 2 x K table (method x token), rare tokens pooled into one category so
every expected count is large enough, then Bonferroni over the positions tested. Position 0 is
the prefill's token, drawn the same way by every method: it is not tested.

T > 0, second test (high power): each round records the accepted drafts a_r and their exact
expectation e_r given the tree and the verify logits (sum over nodes of the target's path
probability). For a lossless verifier E[a_r - e_r | past] = 0, so the differences are martingale
differences and z = mean(d) / (sd(d) / sqrt(n)) over all rounds is asymptotically N(0, 1).

Power, stated for each test: the z-test detects a per-round acceptance bias of
`detectable_bias` drafts with probability 0.9 at level alpha (two-sided); the chi-square test
at one position detects an effect of size `detectable_w` (Cohen's w = sqrt(sum (p1 - p0)^2 / p0)
over the table's cells) with probability 0.9 at the Bonferroni level (noncentral chi-square with
lambda = N w^2).
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import math

import numpy as np

DEFAULT_ALPHA = 0.01
POWER = 0.9  # the power at which detectable effects are stated
OTHER = -1  # the pooled category of rare tokens


def acceptance_z_test(accepted: Sequence[float], expected: Sequence[float], *, alpha: float = DEFAULT_ALPHA,
                      power: float = POWER) -> dict[str, float]:
    """Observed vs exact expected accepted drafts over rounds (see the module docstring).

    Returns rounds, observed and expected means, z, two-sided p_value, reject, and detectable_bias
    (the per-round bias detected with probability `power` at `alpha`).
    """
    from scipy.stats import norm

    d = np.asarray(accepted, dtype=np.float64) - np.asarray(expected, dtype=np.float64)
    n = int(d.size)
    base = {"rounds": n, "observed": float(np.mean(accepted)) if n else float("nan"),
            "expected": float(np.mean(expected)) if n else float("nan"), "alpha": alpha}
    sd = float(d.std(ddof=1)) if n > 1 else 0.0
    if n < 2:
        return {**base, "z": 0.0, "p_value": 1.0, "reject": False, "detectable_bias": float("nan")}
    if sd == 0.0:  # every round differs by the same amount: any nonzero difference is certain
        shift = float(d.mean())
        return {**base, "z": 0.0 if shift == 0 else math.copysign(math.inf, shift),
                "p_value": 1.0 if shift == 0 else 0.0, "reject": shift != 0, "detectable_bias": 0.0}
    z = float(d.mean() / (sd / math.sqrt(n)))
    p_value = float(2.0 * norm.sf(abs(z)))
    detectable = (norm.isf(alpha / 2) + norm.ppf(power)) * sd / math.sqrt(n)
    return {**base, "z": z, "p_value": p_value, "reject": bool(p_value < alpha), "detectable_bias": float(detectable)}


def chi2_detectable_w(total: int, dof: int, level: float, power: float = POWER) -> float:
    """Cohen's w that a chi-square test with `dof` degrees of freedom over `total` observations detects
    with probability `power` at `level` (nan for a degenerate table)."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2

    if total < 1 or dof < 1:
        return float("nan")
    critical = chi2.isf(level, dof)

    def gap(w: float) -> float:
        return float(ncx2.sf(critical, dof, total * w * w)) - power

    return float(brentq(gap, 1e-6, 50.0))


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def greedy_match(reference: Mapping[str, Sequence[int]], candidate: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """Match of candidate outputs against reference outputs over the prompts both have.

    Returns n (prompts compared), matches, match_rate, and mean_prefix_fraction (common
    prefix length / reference length, averaged).
    """
    shared = sorted(set(reference) & set(candidate))
    if not shared:
        return {"n": 0, "matches": 0, "match_rate": float("nan"), "mean_prefix_fraction": float("nan")}
    matches = sum(list(reference[k]) == list(candidate[k]) for k in shared)
    fractions = [
        common_prefix_length(reference[k], candidate[k]) / max(len(reference[k]), 1) for k in shared
    ]
    return {
        "n": len(shared),
        "matches": int(matches),
        "match_rate": matches / len(shared),
        "mean_prefix_fraction": float(np.mean(fractions)),
    }


def pool_rare(counts_a: Counter, counts_b: Counter, min_count: int) -> tuple[list[int], np.ndarray]:
    """2 x K table; categories whose pooled count is below `min_count` merge into OTHER."""
    pooled = counts_a + counts_b
    keep = sorted(t for t, c in pooled.items() if c >= min_count and t != OTHER)
    rare = [t for t in pooled if t not in keep]
    categories = list(keep)
    rows = [[counts_a.get(t, 0) for t in keep], [counts_b.get(t, 0) for t in keep]]
    if rare:
        categories.append(OTHER)
        rows[0].append(sum(counts_a.get(t, 0) for t in rare))
        rows[1].append(sum(counts_b.get(t, 0) for t in rare))
    return categories, np.asarray(rows, dtype=np.int64)


def chi2_homogeneity(
    tokens_a: Sequence[int], tokens_b: Sequence[int], *, min_count: int = 5, fallback_buckets: int = 8
) -> dict[str, float]:
    """Chi-square test that two samples of tokens share one distribution.

    Returns statistic, dof, p_value, n_a, n_b, categories, binning. With a spread-out
    distribution and few samples every token is rare and pooling leaves one category; then the
    test is run on `token mod fallback_buckets` instead (binning "mod<k>"): a fixed function of
    the token, so it has the same law under both methods and the test stays valid. Degenerate
    tables (an empty sample or one category) give statistic 0, dof 0, p_value 1.0.
    """
    from scipy.stats import chi2 as chi2_dist

    if min_count < 1:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    if fallback_buckets < 2:
        raise ValueError(f"fallback_buckets must be at least 2, got {fallback_buckets}")
    counts_a, counts_b = Counter(int(t) for t in tokens_a), Counter(int(t) for t in tokens_b)
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    categories, table = pool_rare(counts_a, counts_b, min_count)
    binning = "tokens"
    if len(categories) < 2 and n_a and n_b:
        binning = f"mod{fallback_buckets}"
        counts_a = Counter(int(t) % fallback_buckets for t in tokens_a)
        counts_b = Counter(int(t) % fallback_buckets for t in tokens_b)
        categories, table = pool_rare(counts_a, counts_b, min_count)
    result = {"n_a": n_a, "n_b": n_b, "categories": len(categories), "binning": binning}
    if n_a == 0 or n_b == 0 or len(categories) < 2:
        return {**result, "statistic": 0.0, "dof": 0, "p_value": 1.0}
    col = table.sum(axis=0, keepdims=True)  # [1, K]
    row = table.sum(axis=1, keepdims=True)  # [2, 1]
    expected = row * col / table.sum()  # [2, K]
    statistic = float(((table - expected) ** 2 / expected).sum())
    dof = len(categories) - 1
    return {**result, "statistic": statistic, "dof": dof, "p_value": float(chi2_dist.sf(statistic, dof))}


def sampled_token_test(
    sequences_a: Sequence[Sequence[int]],
    sequences_b: Sequence[Sequence[int]],
    *,
    positions: Sequence[int] = (0, 1, 2, 3),
    alpha: float = DEFAULT_ALPHA,
    min_count: int = 5,
) -> list[dict[str, float]]:
    """One chi-square row per output position, then a Bonferroni `combined` row (position -1).

    `reject` is True when p_value < alpha / (number of positions tested) for a position,
    and for the combined row when any position rejects (family-wise level alpha).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not positions:
        raise ValueError("positions must name at least one output position")
    rows = []
    for position in positions:
        if position < 0:
            raise ValueError(f"positions must be non-negative, got {position}")
        a = [seq[position] for seq in sequences_a if len(seq) > position]
        b = [seq[position] for seq in sequences_b if len(seq) > position]
        rows.append({"position": int(position), **chi2_homogeneity(a, b, min_count=min_count)})
    level = alpha / len(rows)
    for row in rows:
        row["alpha"] = alpha
        row["reject"] = bool(row["p_value"] < level)
        row["detectable_w"] = chi2_detectable_w(int(row["n_a"] + row["n_b"]), int(row["dof"]), level)
    min_p = min(row["p_value"] for row in rows)
    rows.append(
        {
            "position": -1,
            "n_a": len(sequences_a),
            "n_b": len(sequences_b),
            "categories": 0,
            "binning": "bonferroni",
            "statistic": float("nan"),
            "dof": 0,
            "p_value": float(min(1.0, min_p * len(positions))),  # Bonferroni-adjusted
            "alpha": alpha,
            "reject": any(row["reject"] for row in rows),
            "detectable_w": float(np.nanmax([r["detectable_w"] for r in rows]))
            if any(not math.isnan(r["detectable_w"]) for r in rows) else float("nan"),
        }
    )
    return rows
