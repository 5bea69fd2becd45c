"""Losslessness statistics on inputs whose answers are known by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from ddtree.pipeline.lossless import (
    chi2_homogeneity,
    common_prefix_length,
    greedy_match,
    sampled_token_test,
)


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5, 6], [5, 6, 7]) == 2


def test_greedy_match_counts_exact_and_prefix():
    ref = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9]}
    cand = {"a": [1, 2, 3, 4], "b": [5, 6, 0, 0], "d": [1]}
    stats = greedy_match(ref, cand)
    assert stats["n"] == 2 and stats["matches"] == 1
    assert stats["match_rate"] == 0.5
    assert stats["mean_prefix_fraction"] == pytest.approx((1.0 + 0.5) / 2)


def test_greedy_match_without_shared_prompts_is_nan():
    assert np.isnan(greedy_match({"a": [1]}, {"b": [1]})["match_rate"])


def test_chi2_matches_hand_computation():
    # 2 x 2 table [[30, 10], [20, 20]]: expected [[25, 15], [25, 15]].
    a = [1] * 30 + [2] * 10
    b = [1] * 20 + [2] * 20
    result = chi2_homogeneity(a, b)
    expected_stat = (25 / 25 + 25 / 15 + 25 / 25 + 25 / 15)
    assert result["statistic"] == pytest.approx(expected_stat)
    assert result["dof"] == 1
    ref = chi2_contingency(np.array([[30, 10], [20, 20]]), correction=False)
    assert result["p_value"] == pytest.approx(ref.pvalue)


def test_chi2_identical_samples_give_p_one():
    tokens = [1] * 10 + [2] * 10 + [3] * 10
    result = chi2_homogeneity(tokens, list(tokens))
    assert result["statistic"] == pytest.approx(0.0)
    assert result["p_value"] == pytest.approx(1.0)


def test_chi2_pools_rare_tokens_and_handles_degenerate_tables():
    a = [1] * 20 + [7, 8]
    b = [1] * 20 + [9]
    result = chi2_homogeneity(a, b, min_count=5)
    assert result["categories"] == 2 and result["binning"] == "tokens"  # token 1 and the pooled rare ones
    assert chi2_homogeneity([], [1, 2])["p_value"] == 1.0
    assert chi2_homogeneity([1, 1], [1, 1])["dof"] == 0
    with pytest.raises(ValueError, match="fallback_buckets"):
        chi2_homogeneity([1], [1], fallback_buckets=1)


def test_chi2_falls_back_to_buckets_when_every_token_is_rare():
    # 40 distinct tokens per sample: pooling alone leaves one category.
    a = list(range(0, 400, 10))  # all = 0 mod 8 or 2/4/6 mod 8: even residues only
    b = list(range(1, 401, 10))  # odd residues only
    result = chi2_homogeneity(a, b, min_count=5, fallback_buckets=8)
    assert result["binning"] == "mod8" and result["categories"] >= 2
    table = np.array([[sum(t % 8 == r for t in a) for r in range(8)], [sum(t % 8 == r for t in b) for r in range(8)]])
    table = table[:, table.sum(axis=0) > 0]
    assert result["p_value"] == pytest.approx(chi2_contingency(table, correction=False).pvalue)
    assert result["p_value"] < 1e-6
    with pytest.raises(ValueError, match="min_count"):
        chi2_homogeneity([1], [1], min_count=0)


def test_sampled_token_test_same_law_does_not_reject_different_law_does():
    # Significance level alpha = 0.01 family-wise; with a fixed seed the outcome is deterministic.
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    same_a = rng.choice(4, size=(400, 3), p=probs).tolist()
    same_b = rng.choice(4, size=(400, 3), p=probs).tolist()
    rows = sampled_token_test(same_a, same_b, positions=(0, 1, 2), alpha=0.01)
    assert len(rows) == 4 and rows[-1]["position"] == -1
    assert not rows[-1]["reject"]
    shifted = rng.choice(4, size=(400, 3), p=probs[::-1]).tolist()
    rows = sampled_token_test(same_a, shifted, positions=(0, 1, 2), alpha=0.01)
    assert rows[-1]["reject"] and all(r["reject"] for r in rows[:-1])
    assert rows[-1]["p_value"] == pytest.approx(min(1.0, 3 * min(r["p_value"] for r in rows[:-1])))


def test_sampled_token_test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        sampled_token_test([[1]], [[1]], alpha=1.5)
    with pytest.raises(ValueError, match="positions"):
        sampled_token_test([[1]], [[1]], positions=())
