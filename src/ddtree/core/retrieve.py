"""EAGLE-style retrieve encoding of a draft tree (the layout SGLang's tree kernels consume).

Works for any column numbering (best-first or not): children of a node are ordered by descending
`node_logws` (siblings share the parent prefix, so this is descending edge probability), ties by column.
Column 0 is the root; column i > 0 is a real node iff its parent is >= 0.
"""

from __future__ import annotations

import torch

from ddtree.core.checks import check_tensor
from ddtree.core.types import DDTreeBuildResult, RetrieveEncoding


def _check_tree(tree: object) -> DDTreeBuildResult:
    if not isinstance(tree, DDTreeBuildResult):
        raise ValueError(f"tree must be a DDTreeBuildResult, got {type(tree).__name__}")
    check_tensor("tree.parents", tree.parents, ndim=2)
    check_tensor("tree.node_logws", tree.node_logws, ndim=2)
    if tree.parents.shape != tree.node_logws.shape or tree.parents.shape[1] < 1:
        raise ValueError(
            f"tree.parents {tuple(tree.parents.shape)} and tree.node_logws {tuple(tree.node_logws.shape)} "
            "must share one [B, N] shape with N >= 1"
        )
    return tree


def node_mask(tree: DDTreeBuildResult) -> torch.Tensor:
    """[B, N] bool: the root and every real node (padding columns have parent -1)."""
    real = tree.parents >= 0
    real[:, 0] = True
    return real


def encode_retrieve(tree: DDTreeBuildResult) -> RetrieveEncoding:
    """retrieve_index / retrieve_next_token / retrieve_next_sibling, each [B, N] int64, -1 terminated."""
    tree = _check_tree(tree)
    parents = tree.parents  # [B, N]
    b, n = parents.shape
    dev = parents.device
    real = node_mask(tree)  # [B, N]
    cols = torch.arange(n, device=dev).expand(b, n)  # [B, N]
    is_child = real & (cols > 0)

    # order columns by (parent, logw desc, column): two stable sorts; non-children get parent key n (last)
    parent_key = torch.where(is_child, parents, torch.full_like(parents, n))
    by_logw = torch.sort(tree.node_logws.float(), dim=1, descending=True, stable=True).indices  # [B, N]
    by_parent = torch.sort(parent_key.gather(1, by_logw), dim=1, stable=True).indices
    order = by_logw.gather(1, by_parent)  # [B, N] columns, grouped by parent, best child first
    sorted_parent = parent_key.gather(1, order)  # [B, N]

    # next sibling: the following column in `order` when it has the same parent
    same_next = torch.zeros_like(real)
    same_next[:, :-1] = (sorted_parent[:, 1:] == sorted_parent[:, :-1]) & (sorted_parent[:, :-1] < n)
    following = torch.full_like(order, -1)
    following[:, :-1] = order[:, 1:]
    next_sibling = torch.full_like(parents, -1)
    next_sibling.scatter_(1, order, torch.where(same_next, following, -1))

    # first child: the first column of each parent's group; groups of the dummy parent n land in column n
    group_start = torch.ones_like(real)
    group_start[:, 1:] = sorted_parent[:, 1:] != sorted_parent[:, :-1]
    target = torch.where(group_start, sorted_parent, torch.full_like(sorted_parent, n))  # [B, N]
    first_child = torch.full((b, n + 1), -1, dtype=torch.int64, device=dev)
    first_child.scatter_(1, target, torch.where(group_start, order, -1))
    next_token = first_child[:, :n].contiguous()

    flat = cols + torch.arange(b, device=dev).unsqueeze(1) * n
    retrieve_index = torch.where(real, flat, -1)
    return RetrieveEncoding(
        retrieve_index=retrieve_index,
        retrieve_next_token=torch.where(real, next_token, -1),
        retrieve_next_sibling=torch.where(real, next_sibling, -1),
    )
