"""Ancestor-only tree attention for the verify forward.

mask[b, i, j] is True iff column j is column i itself or one of its ancestors. The closure is built by
pointer jumping (ceil(log2 N) rounds of row gathers), so there is no loop over nodes and no host sync.
Padding columns (parent -1) see only themselves, so no attention row is ever fully masked.
"""

from __future__ import annotations

import math

import torch

from ddtree.core.checks import check_tensor
from ddtree.core.types import DDTreeBuildResult, TreeAttention


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, N] int64 (-1 = none) -> [B, N, N] bool, self and ancestors."""
    check_tensor("parents", parents, ndim=2)
    b, n = parents.shape
    dev = parents.device
    # row n is an all-False sentinel: "no ancestor at that distance"
    mask = torch.zeros((b, n + 1, n), dtype=torch.bool, device=dev)  # [B, N+1, N]
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    mask[:, :n] = eye
    jump = torch.where(parents >= 0, parents, n)  # [B, N], 2^r-th ancestor (n = none)
    jump = torch.cat([jump, torch.full((b, 1), n, dtype=parents.dtype, device=dev)], 1)  # [B, N+1]
    # invariant after r rounds: mask[i] = i and its ancestors at distance < 2^r; jump[i] = 2^r-th ancestor
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        gathered = mask.gather(1, jump.unsqueeze(2).expand(b, n + 1, n))  # [B, N+1, N] rows of the jump target
        mask = mask | gathered
        mask[:, n] = False
        jump = jump.gather(1, jump)
    return mask[:, :n]


def tree_attention(tree: DDTreeBuildResult) -> TreeAttention:
    """position_offsets = depths [B, N]; mask [B, N, N] bool, ancestor-only (self included)."""
    if not isinstance(tree, DDTreeBuildResult):
        raise ValueError(f"tree must be a DDTreeBuildResult, got {type(tree).__name__}")
    check_tensor("tree.depths", tree.depths, ndim=2)
    if tree.depths.shape != tree.parents.shape:
        raise ValueError(
            f"tree.depths {tuple(tree.depths.shape)} and tree.parents {tuple(tree.parents.shape)} must match"
        )
    return TreeAttention(position_offsets=tree.depths.to(torch.int64), mask=ancestor_mask(tree.parents))
