"""The accept walk over a draft tree, shared by every verifier and the SGLang kernel adapter.

A verifier picks one token per node; the walk starts at the root and moves to the child whose token equals the
pick at the current node (children carry distinct tokens), and the first pick that is not a child is the bonus.
Everything here is tensor ops on [B, N] values with a fixed loop count: no host synchronisation (capture-safe).
"""

from __future__ import annotations

import torch

from ddtree.core.types import DDTreeBuildResult, VerifyResult


def edge_probs(tree: DDTreeBuildResult, probs: torch.Tensor, row_totals: torch.Tensor | None = None) -> torch.Tensor:
    """[B, N] fp32: probs[b, parent(i), token(i)] for real non-root nodes, 0 for the root and padding.

    With `row_totals` ([B, N, 1]), `probs` holds unnormalised weights and each value is divided by
    its parent row's total.
    """
    values = at_parent_rows(tree, probs)  # [B, N]
    if row_totals is not None:
        values = values / row_totals.reshape(tree.batch_size, -1).gather(1, tree.parents.clamp_min(0))
    return values.masked_fill_(tree.parents < 0, 0.0)  # root and padding have parent -1


def at_parent_rows(tree: DDTreeBuildResult, rows: torch.Tensor) -> torch.Tensor:
    """[B, N] fp32: rows[b, parent(i), token(i)] from a per-node [B, N, V] tensor (root and padding read
    row 0 / token 0: callers mask them)."""
    batch, cols, vocab = rows.shape
    flat = tree.parents.clamp_min(0) * vocab + tree.token_ids.clamp_min(0)  # [B, N]
    return rows.reshape(batch, cols * vocab).gather(1, flat).float()


def path_products(tree: DDTreeBuildResult, edge_values: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[B, N] fp32: product of `edge_values` along the path from the root (root 1; deeper than D: 0).

    Pointer doubling: after k rounds each node holds the product over itself and its 2^k - 1 nearest
    ancestors (the root, value 1, is its own ancestor), so ceil(log2(D + 1)) rounds of two [B, N] gathers
    replace a loop over the D depths.
    """
    cols = torch.arange(tree.num_columns, device=tree.device)
    within = (tree.parents >= 0) & (tree.depths <= max_depth)  # [B, N] real nodes the walk can reach
    prod = torch.where(within, edge_values.float(), (cols == 0).to(torch.float32))  # [B, N], root 1
    ancestor = tree.parents.clamp_min(0)  # [B, N], root (and padding, whose value is 0) -> root
    for _ in range(max_depth.bit_length()):  # 2^rounds > max_depth
        prod = prod * prod.gather(1, ancestor)
        ancestor = ancestor.gather(1, ancestor)
    return prod


def walk(
    tree: DDTreeBuildResult, picks: torch.Tensor, edge_p: torch.Tensor | None, max_depth: int
) -> VerifyResult:
    """The shared walk: accept while the pick at the current node is one of its children.

    picks  [B, N] int64: token picked at each node (row i = at node i).
    edge_p [B, N] fp32: processed target prob of each node's token at its parent (for the expectation); None
    means greedy picks (expected_accept_len = accept_len, one path product less).
    """
    batch, cols = tree.token_ids.shape
    parent = tree.parents.clamp_min(0)
    # Node i matches when it is a real node whose token is the pick at its parent.
    match = (tree.parents >= 0) & (tree.token_ids == picks.gather(1, parent))  # [B, N]
    accepted = path_products(tree, match.to(torch.float32), max_depth) > 0.5  # [B, N], root included
    accept_len = accepted.sum(dim=1) - 1  # [B], root excluded
    if edge_p is None:
        expected = accept_len.to(torch.float32)
    else:
        expected = path_products(tree, edge_p, max_depth)[:, 1:].sum(dim=1)  # [B]

    # One accepted node per depth: scatter node indices into their depth slot (spare slot D + 1 for the rest).
    slot = torch.where(accepted, tree.depths.clamp(0, max_depth), max_depth + 1)  # [B, N]
    node_ids = torch.arange(cols, device=tree.device).expand(batch, cols)
    accepted_nodes = torch.full((batch, max_depth + 2), -1, dtype=torch.int64, device=tree.device)
    accepted_nodes.scatter_(1, slot, node_ids)
    accepted_nodes = accepted_nodes[:, : max_depth + 1].contiguous()  # [B, D + 1]
    return path_result(accept_len, accepted_nodes, picks, expected)


def path_result(
    accept_len: torch.Tensor, accepted_nodes: torch.Tensor, picks: torch.Tensor, expected: torch.Tensor
) -> VerifyResult:
    """VerifyResult of an accepted path: the bonus is the pick at its last node.

    accept_len [B]; accepted_nodes [B, D + 1] (root first, -1 padded); picks [B, N] (token picked at each
    node); expected [B].
    """
    last = accepted_nodes.gather(1, accept_len.unsqueeze(1))  # [B, 1]
    bonus = picks.gather(1, last).squeeze(1)  # [B]
    return VerifyResult(
        accept_len=accept_len,
        accepted_nodes=accepted_nodes,
        bonus_token=bonus,
        expected_accept_len=expected.to(torch.float32),
    )
