"""Temperature-aware tree choice: the drafter's marginals processed like the target's.

`build_tree(draft_logits, budget, sampling=params)` builds the tree on `processed_draft_logprobs`:
the log of the drafter's per-position distribution after the request's temperature, top-k and top-p
(`ddtree.core.sampling.process_logits`, the processing the target's verify applies). A node whose
token the processed distribution can never emit gets a log-probability below every possible one
(`impossible_floor`), so such nodes rank after every possible node and only fill a budget that the
possible nodes cannot; among themselves they keep the drafter's raw order. Greedy rows (T = 0) keep
the raw logits: the tree at T = 0 is the raw tree.

It is a tree-choice policy only: the verify is unchanged, so losslessness is untouched.

`tree_logit_scale` is the default policy of every engine for sampled rows: the raw draft logits divided by the
tree temperature 1 + T before the build (processing them like the target's, above, stays an experiment option).
"""

from __future__ import annotations

import math

import torch

from ddtree.core.sampling import SamplingParams, process_logits

# log of the smallest positive fp32 number (a denormal): no possible token has a log-probability below it
MIN_LOG_PROB = math.log(torch.finfo(torch.float32).smallest_normal) - 23 * math.log(2.0)  # about -103.28


def tree_logit_scale(temperature: torch.Tensor | float) -> torch.Tensor | float:
    """1 / (1 + T), elementwise: the factor a request's draft logits are multiplied by before its tree is built.

    A sampled verify accepts a drafted token with about the target's T-tempered probability of it, while a DFlash
    drafter trained on its target's greedy text predicts the greedy token: its marginals are sharper than what the
    verify accepts from at T > 0, and flattened they rank wider trees first. The tree temperature 1 + T is the best
    of a sweep on the shipped small pair (`benchmarks/tree_temperature.py`; at T = 1 and budget 32 the expected
    tau rose from 1.42 to 1.57). Greedy rows (T = 0) get 1: their trees are unchanged. A tree-choice policy only
    (the verify is unchanged), so losslessness is untouched."""
    return 1.0 / (1.0 + temperature)


def impossible_floor(depth: int) -> float:
    """Log-probability given to impossible tokens: 2 * depth * MIN_LOG_PROB. A path of `depth` possible
    tokens scores >= depth * MIN_LOG_PROB; any path through an impossible token scores below it."""
    return 2.0 * depth * MIN_LOG_PROB


def processed_draft_logprobs(draft_logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """[B, D, V] fp32 log-probabilities of the processed drafter marginals (see the module docstring).

    Row b uses request b's parameters (scalars or [B] tensors, as for the target). Impossible tokens:
    `impossible_floor(D)` + the raw log-softmax (<= 0), so they order among themselves as the raw tree.
    """
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must have shape [B, D, V], got {tuple(draft_logits.shape)}")
    raw = torch.log_softmax(draft_logits.float(), dim=-1)  # [B, D, V]
    probs = process_logits(draft_logits, sampling)  # [B, D, V] fp32 (greedy rows one-hot)
    out = torch.where(probs > 0, probs.log(), raw + impossible_floor(int(draft_logits.shape[1])))
    if sampling.any_greedy:
        temperature, _, _ = sampling.broadcast(int(draft_logits.shape[0]), draft_logits.device)
        greedy = (temperature == 0).view(-1, 1, 1)  # [B, 1, 1]
        out = torch.where(greedy, raw, out)
    return out
