"""Helpers shared by the builder / retrieve / attention tests (exposed as session fixtures).

Everything here is a plain, slow, obviously-correct reference: Python loops over nodes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ddtree.core.types import DDTreeBuildResult


def naive_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] parents -> [B, N, N] bool: self and every ancestor, by walking parent pointers."""
    b, n = parents.shape
    par = parents.tolist()
    mask = torch.zeros((b, n, n), dtype=torch.bool)
    for row in range(b):
        for i in range(n):
            j = i
            while j >= 0:
                mask[row, i, j] = True
                j = par[row][j]
    return mask


def token_paths(tree: DDTreeBuildResult) -> list[list[tuple[int, ...]]]:
    """Per request, the token path (root excluded) of every real node, in column order."""
    out = []
    tok, par = tree.token_ids.tolist(), tree.parents.tolist()
    for b in range(tree.batch_size):
        paths = []
        for i in range(1, int(tree.num_nodes[b])):
            path, j = [], i
            while j > 0:
                path.append(tok[b][j])
                j = par[b][j]
            paths.append(tuple(reversed(path)))
        out.append(paths)
    return out


def permute_columns(tree: DDTreeBuildResult, generator: torch.Generator) -> tuple[DDTreeBuildResult, torch.Tensor]:
    """Shuffle columns 1..N-1 of every row (root stays at 0), remapping parents.

    Returns the permuted tree and `where` [B, N]: where[b, old] = new column.
    """
    b, n = tree.parents.shape
    perm = torch.stack([torch.cat([torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(n - 1, generator=generator)])
                        for _ in range(b)])  # perm[b, new] = old
    where = torch.empty_like(perm)
    where.scatter_(1, perm, torch.arange(n).expand(b, n).contiguous())
    parents = tree.parents.gather(1, perm)
    parents = torch.where(parents >= 0, where.gather(1, parents.clamp(min=0)), -1)
    permuted = DDTreeBuildResult(
        token_ids=tree.token_ids.gather(1, perm),
        parents=parents,
        depths=tree.depths.gather(1, perm),
        node_logws=tree.node_logws.gather(1, perm),
        num_nodes=tree.num_nodes.clone(),
    )
    return permuted, where


@pytest.fixture(scope="session")
def tree_tools() -> SimpleNamespace:
    return SimpleNamespace(
        naive_ancestors=naive_ancestors, token_paths=token_paths, permute_columns=permute_columns
    )
