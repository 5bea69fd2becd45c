"""Hand-made draft trees, independent of the builder: the fixtures of the core tests and of `ddtree selfcheck`.

A tree is a list of nodes (parent, token, logw), root first, numbered best-first: logw strictly
decreases from parent to child and nodes are sorted by descending logw, so parents precede children
and siblings appear in descending probability, as the builder's output.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from ddtree.core.types import DDTreeBuildResult, RetrieveEncoding


@dataclass(frozen=True)
class Node:
    parent: int  # -1 for the root
    token: int  # -1 for the root
    logw: float  # 0 for the root
    depth: int


def random_tree(num_nodes: int, vocab: int, max_depth: int, rng: random.Random) -> list[Node]:
    """A random trie with `num_nodes` nodes (root included), distinct child tokens, depth <= max_depth."""
    raw = [Node(-1, -1, 0.0, 0)]
    children: dict[int, set[int]] = {0: set()}
    while len(raw) < num_nodes:
        parent = rng.randrange(len(raw))
        if raw[parent].depth >= max_depth or len(children[parent]) >= vocab:
            continue
        token = rng.choice([t for t in range(vocab) if t not in children[parent]])
        children[parent].add(token)
        logw = raw[parent].logw + math.log(rng.uniform(0.05, 0.95))
        children[len(raw)] = set()
        raw.append(Node(parent, token, logw, raw[parent].depth + 1))
    order = sorted(range(len(raw)), key=lambda i: -raw[i].logw)  # best-first; root (logw 0) first
    new_index = {old: new for new, old in enumerate(order)}
    return [
        Node(new_index[raw[old].parent] if raw[old].parent >= 0 else -1, raw[old].token, raw[old].logw, raw[old].depth)
        for old in order
    ]


def chain_tree(tokens: list[int]) -> list[Node]:
    """A single path root -> tokens[0] -> tokens[1] -> ..."""
    nodes = [Node(-1, -1, 0.0, 0)]
    for i, token in enumerate(tokens):
        nodes.append(Node(i, token, -0.5 * (i + 1), i + 1))
    return nodes


def example_tree() -> list[Node]:
    """A small branching tree over tokens 0..5 (root children 2, 0, 5; node 1 has children 3, 1)."""
    return [
        Node(-1, -1, 0.0, 0),
        Node(0, 2, -0.2, 1),  # 1
        Node(0, 0, -0.9, 1),  # 2
        Node(1, 3, -1.0, 2),  # 3
        Node(1, 1, -1.5, 2),  # 4
        Node(0, 5, -1.6, 1),  # 5
        Node(3, 4, -1.7, 3),  # 6
        Node(2, 2, -2.0, 2),  # 7
    ]


def batch_trees(trees: list[list[Node]], num_columns: int | None = None, device: str = "cpu") -> DDTreeBuildResult:
    """Stack node lists into a DDTreeBuildResult, padding to `num_columns` (default: the largest tree)."""
    cols = num_columns or max(len(t) for t in trees)
    batch = len(trees)
    token_ids = torch.full((batch, cols), -1, dtype=torch.int64)
    parents = torch.full((batch, cols), -1, dtype=torch.int64)
    depths = torch.zeros((batch, cols), dtype=torch.int64)
    logws = torch.full((batch, cols), -math.inf, dtype=torch.float32)
    for b, tree in enumerate(trees):
        if len(tree) > cols:
            raise ValueError(f"tree {b} has {len(tree)} nodes, more than num_columns={cols}")
        for i, node in enumerate(tree):
            token_ids[b, i], parents[b, i], depths[b, i], logws[b, i] = node.token, node.parent, node.depth, node.logw
    num_nodes = torch.tensor([len(t) for t in trees], dtype=torch.int64)
    return DDTreeBuildResult(
        token_ids=token_ids.to(device),
        parents=parents.to(device),
        depths=depths.to(device),
        node_logws=logws.to(device),
        num_nodes=num_nodes.to(device),
    )


def repeat_tree(tree: list[Node], batch: int, device: str = "cpu") -> DDTreeBuildResult:
    """The same tree in every one of `batch` rows."""
    one = batch_trees([tree], device=device)
    return DDTreeBuildResult(*(getattr(one, f).expand(batch, *getattr(one, f).shape[1:]).contiguous()
                               for f in ("token_ids", "parents", "depths", "node_logws", "num_nodes")))


def node_lists(tree: DDTreeBuildResult) -> list[list[Node]]:
    """Back to per-request node lists (padding dropped)."""
    out = []
    for b in range(tree.batch_size):
        n = int(tree.num_nodes[b])
        out.append([
            Node(int(tree.parents[b, i]), int(tree.token_ids[b, i]), float(tree.node_logws[b, i]),
                 int(tree.depths[b, i]))
            for i in range(n)
        ])
    return out


def children_of(nodes: list[Node]) -> dict[int, list[int]]:
    """Children of every node, in descending logw (retrieve order)."""
    kids: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for i, node in enumerate(nodes):
        if node.parent >= 0:
            kids[node.parent].append(i)
    for lst in kids.values():
        lst.sort(key=lambda i: -nodes[i].logw)
    return kids


def naive_encode_retrieve(tree: DDTreeBuildResult) -> RetrieveEncoding:
    """EAGLE-style retrieve arrays by a plain Python walk (stand-in for ddtree.core.retrieve)."""
    batch, cols = tree.token_ids.shape
    index = torch.full((batch, cols), -1, dtype=torch.int64)
    next_token = torch.full((batch, cols), -1, dtype=torch.int64)
    next_sibling = torch.full((batch, cols), -1, dtype=torch.int64)
    for b, nodes in enumerate(node_lists(tree)):
        for i in range(len(nodes)):
            index[b, i] = b * cols + i
        for parent, kids in children_of(nodes).items():
            if kids:
                next_token[b, parent] = kids[0]
            for a, c in zip(kids, kids[1:]):
                next_sibling[b, a] = c
    dev = tree.device
    return RetrieveEncoding(index.to(dev), next_token.to(dev), next_sibling.to(dev))
