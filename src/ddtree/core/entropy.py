"""Per-token entropy of the target's processed distribution (what a sampled request actually draws from)."""

from __future__ import annotations

import torch

from ddtree.core.sampling import SamplingParams, process_logits


def processed_entropy(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[B] fp32 entropy in nats of the processed distribution of logits [B, V] (0 for greedy rows: one-hot)."""
    if params.all_greedy:
        return torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
    probs = process_logits(logits, params)  # [B, V]
    return -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)
