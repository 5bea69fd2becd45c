"""Sampling verifiers by name: the exact one and deliberately LOSSY variants for the power panel.

The lossy variants exist only to show that the losslessness tests can fail: the pipeline runs one of
them (`lossless.power_panel` in the config; the server's `--verifier NAME`) and the report shows it
rejected next to the real verifiers. They reproduce bugs seen in real ports; never serve with them.

Every entry has `verify_sampling`'s signature and returns a `VerifyResult` whose
`expected_accept_len` is what that implementation would report (the exact expectation under the
parameters it uses), so the observed-vs-expected test sees what a real buggy build would show.

- "exact": `ddtree.core.verify.verify_sampling` (lossless).
- "greedy_accept": accepts a child only when it is the target's argmax (greedy acceptance at T > 0),
  then samples the bonus; reports the exact sampled expectation. Observed acceptance departs from
  the expectation, and the output law is not the target's.
- "ignore_top_k_top_p": samples with the temperature only (top-k and top-p dropped), and computes the
  expectation with the same wrong parameters (so only the token-law test can see it).
- "bonus_redraw": after the walk stops, redraws the bonus from the whole processed distribution at
  the last node, so it may equal a rejected child (the correct bonus is the pick that rejected
  every child). Acceptance is exact; only the token law changes.
At T = 0 every variant is the exact greedy verify (the bugs are in the sampled path).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ddtree.core.sampling import SamplingParams, processed_weights
from ddtree.core.types import DDTreeBuildResult, VerifyResult
from ddtree.core.verify import (
    check_verify_inputs,
    edge_probs,
    resolve_max_depth,
    sample_from_probs_,
    verify_sampling,
    walk,
)

Verifier = Callable[..., VerifyResult]


def _with_bonus(result: VerifyResult, bonus_picks: torch.Tensor) -> VerifyResult:
    """The same accepted path with the bonus read from `bonus_picks` [B, N] at the last accepted node."""
    last = result.accepted_nodes.gather(1, result.accept_len.unsqueeze(1))  # [B, 1]
    return VerifyResult(result.accept_len, result.accepted_nodes, bonus_picks.gather(1, last).squeeze(1),
                        result.expected_accept_len)


def verify_greedy_accept(
    tree: DDTreeBuildResult, target_logits: torch.Tensor, params: SamplingParams,
    generator: torch.Generator | None = None, *, max_depth: int | None = None, backend: str = "auto",
) -> VerifyResult:
    """LOSSY: argmax acceptance at T > 0 with a sampled bonus (see the module docstring)."""
    if params.all_greedy:
        return verify_sampling(tree, target_logits, params, generator, max_depth=max_depth, backend=backend)
    check_verify_inputs(tree, target_logits)
    depth = resolve_max_depth(tree, max_depth)
    weights, totals = processed_weights(target_logits, params)  # [B, N, V], [B, N, 1]
    edge_p = edge_probs(tree, weights, totals)  # [B, N]
    sampled = sample_from_probs_(weights, generator)  # [B, N]
    greedy = walk(tree, target_logits.argmax(dim=-1), edge_p, depth)
    return _with_bonus(greedy, sampled)


def verify_ignore_top_k_top_p(
    tree: DDTreeBuildResult, target_logits: torch.Tensor, params: SamplingParams,
    generator: torch.Generator | None = None, *, max_depth: int | None = None, backend: str = "auto",
) -> VerifyResult:
    """LOSSY: the exact walk on the temperature-only distribution (top-k / top-p ignored)."""
    return verify_sampling(tree, target_logits, SamplingParams(temperature=params.temperature), generator,
                           max_depth=max_depth, backend=backend)


def verify_bonus_redraw(
    tree: DDTreeBuildResult, target_logits: torch.Tensor, params: SamplingParams,
    generator: torch.Generator | None = None, *, max_depth: int | None = None, backend: str = "auto",
) -> VerifyResult:
    """LOSSY: exact acceptance, then a bonus redrawn from the unrestricted distribution (may be a child)."""
    if params.all_greedy:
        return verify_sampling(tree, target_logits, params, generator, max_depth=max_depth, backend=backend)
    check_verify_inputs(tree, target_logits)
    depth = resolve_max_depth(tree, max_depth)
    weights, totals = processed_weights(target_logits, params)  # [B, N, V], [B, N, 1]
    edge_p = edge_probs(tree, weights, totals)  # [B, N]
    redraw = sample_from_probs_(weights.clone(), generator)  # [B, N], independent of the picks
    picks = sample_from_probs_(weights, generator)  # [B, N]
    exact = walk(tree, picks, edge_p, depth)
    return _with_bonus(exact, redraw)


SAMPLING_VERIFIERS: dict[str, Verifier] = {
    "exact": verify_sampling,
    "greedy_accept": verify_greedy_accept,
    "ignore_top_k_top_p": verify_ignore_top_k_top_p,
    "bonus_redraw": verify_bonus_redraw,
}
LOSSY_VERIFIERS = tuple(name for name in SAMPLING_VERIFIERS if name != "exact")


def get_verifier(name: str) -> Verifier:
    """The sampling verifier registered under `name` (ValueError naming the choices otherwise)."""
    if name not in SAMPLING_VERIFIERS:
        raise ValueError(f"verifier must be one of {sorted(SAMPLING_VERIFIERS)}, got {name!r}")
    return SAMPLING_VERIFIERS[name]
