"""DFlash's linear draft as a degenerate tree, so `dflash` shares verify and commit with `ddtree`."""

from __future__ import annotations

import torch

from ddtree.core.types import DDTreeBuildResult


def build_chain(draft_logits: torch.Tensor) -> DDTreeBuildResult:
    """Chain of the per-position argmax tokens: node d (1..D) = argmax at drafted position d - 1.

    draft_logits: [B, D, V]. Returns N = D + 1 columns, root at column 0 (token -1, filled by the caller).
    """
    if not isinstance(draft_logits, torch.Tensor) or draft_logits.dim() != 3:
        raise ValueError("draft_logits must be a [B, D, V] tensor")
    batch, depth, _ = draft_logits.shape
    if depth < 1:
        raise ValueError(f"draft_logits must hold at least one drafted position, got D={depth}")
    device = draft_logits.device
    logp = torch.log_softmax(draft_logits.float(), dim=-1)  # [B, D, V]
    best_logp, best = logp.max(dim=-1)  # [B, D]
    cols = torch.arange(depth + 1, device=device)  # [N]
    minus_one = torch.full((batch, 1), -1, dtype=torch.long, device=device)
    token_ids = torch.cat([minus_one, best], dim=1)  # [B, N]
    parents = chain_parents(batch, depth, device)  # [B, N], root -1
    depths = cols.expand(batch, -1).contiguous()  # [B, N]
    node_logws = torch.cat([torch.zeros(batch, 1, device=device), best_logp.cumsum(dim=1)], dim=1)  # [B, N]
    num_nodes = torch.full((batch,), depth + 1, dtype=torch.long, device=device)
    return DDTreeBuildResult(
        token_ids=token_ids, parents=parents, depths=depths, node_logws=node_logws, num_nodes=num_nodes
    )


def chain_parents(batch: int, depth: int, device: torch.device) -> torch.Tensor:
    """[B, D + 1] int64: the chain's parent pointers (column c's parent is c - 1; the root's is -1), the same
    every round."""
    return (torch.arange(depth + 1, device=device) - 1).expand(batch, -1).contiguous()
