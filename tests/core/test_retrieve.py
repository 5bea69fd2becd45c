"""Retrieve encoder: first-child / next-sibling walk covers the tree, siblings in descending logw."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree.core.build import build_tree
from ddtree.core.retrieve import encode_retrieve
from ddtree.core.types import DDTreeBuildResult

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def trees(draw) -> DDTreeBuildResult:
    b, d, v = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 8))
    budget = draw(st.integers(1, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        logits = torch.randint(-1, 2, (b, d, v), generator=gen).float()  # sibling logw ties
    else:
        logits = torch.randn((b, d, v), generator=gen) * 2
    return build_tree(logits, budget, method=draw(st.sampled_from(["heap", "batched"])))


def walk(enc, row: int, n: int) -> list[int]:
    """Depth-first walk over first-child / next-sibling links from the root; returns the visited columns."""
    nt, ns = enc.retrieve_next_token[row].tolist(), enc.retrieve_next_sibling[row].tolist()
    seen, stack = [], [0]
    while stack:
        i = stack.pop()
        seen.append(i)
        assert len(seen) <= n, "cycle in retrieve links"
        if ns[i] != -1:
            stack.append(ns[i])
        if nt[i] != -1:
            stack.append(nt[i])
    return seen


def check_encoding(tree: DDTreeBuildResult) -> None:
    enc = encode_retrieve(tree)
    b, n = tree.parents.shape
    real = tree.parents >= 0
    real[:, 0] = True
    for f in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        t = getattr(enc, f)
        assert t.shape == (b, n) and t.dtype == torch.int64 and t.device == tree.device
    flat = torch.arange(b).unsqueeze(1) * n + torch.arange(n)
    assert torch.equal(enc.retrieve_index, torch.where(real, flat, -1))
    par, lw = tree.parents.tolist(), tree.node_logws.tolist()
    for row in range(b):
        columns = [i for i in range(n) if real[row, i]]
        visited = walk(enc, row, n)
        assert sorted(visited) == columns, "every node exactly once"
        assert (enc.retrieve_next_token[row][~real[row]] == -1).all()
        assert (enc.retrieve_next_sibling[row][~real[row]] == -1).all()
        assert enc.retrieve_next_sibling[row, 0] == -1
        for p in columns:
            kids = [i for i in columns if i > 0 and par[row][i] == p]
            chain, c = [], int(enc.retrieve_next_token[row, p])
            while c != -1:
                assert par[row][c] == p, "sibling chain stays under one parent"
                chain.append(c)
                c = int(enc.retrieve_next_sibling[row, c])
            assert sorted(chain) == sorted(kids)
            logws = [lw[row][c] for c in chain]
            assert logws == sorted(logws, reverse=True), "siblings in descending logw"
            if kids:
                assert lw[row][chain[0]] == max(lw[row][c] for c in kids), "first child is the most probable"


@HYP
@given(tree=trees())
def test_walk_visits_every_node_once(tree: DDTreeBuildResult) -> None:
    check_encoding(tree)


@HYP
@given(tree=trees(), seed=st.integers(0, 2**31 - 1))
def test_any_numbering(tree: DDTreeBuildResult, seed: int, tree_tools) -> None:
    permuted, where = tree_tools.permute_columns(tree, torch.Generator().manual_seed(seed))
    check_encoding(permuted)
    # same tree, relabelled: the permuted encoding is the original one with columns mapped through `where`
    orig, perm = encode_retrieve(tree), encode_retrieve(permuted)
    real = tree.parents >= 0
    real[:, 0] = True
    for f in ("retrieve_next_token", "retrieve_next_sibling"):
        a = getattr(orig, f)
        mapped = torch.where(a >= 0, where.gather(1, a.clamp(min=0)), -1)  # [B, N] in new labels, old positions
        # ties between siblings may be broken by column, which a permutation changes: compare where no tie
        ties = tree.node_logws.unsqueeze(2) == tree.node_logws.unsqueeze(1)
        tie_free = (ties & (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1))).sum(2) == 1
        if bool(tie_free[real].all()):
            assert torch.equal(getattr(perm, f).gather(1, where), mapped)


def test_hand_made_tree() -> None:
    # root -> 1 (-0.1), 2 (-0.5), 4 (-0.4); 1 -> 3 (-0.3); columns deliberately not best-first
    tree = DDTreeBuildResult(
        token_ids=torch.tensor([[-1, 7, 8, 9, 5, -1]]),
        parents=torch.tensor([[-1, 0, 0, 1, 0, -1]]),
        depths=torch.tensor([[0, 1, 1, 2, 1, 0]]),
        node_logws=torch.tensor([[0.0, -0.1, -0.5, -0.3, -0.4, float("-inf")]]),
        num_nodes=torch.tensor([5]),
    )
    enc = encode_retrieve(tree)
    assert enc.retrieve_index.tolist() == [[0, 1, 2, 3, 4, -1]]
    assert enc.retrieve_next_token.tolist() == [[1, 3, -1, -1, -1, -1]]
    assert enc.retrieve_next_sibling.tolist() == [[-1, 4, -1, -1, 2, -1]]


def test_bad_tree_raises() -> None:
    with pytest.raises(ValueError, match="tree"):
        encode_retrieve("not a tree")
    bad = DDTreeBuildResult(*(torch.zeros(2, 3, dtype=torch.int64) for _ in range(3)), torch.zeros(2, 4), torch.ones(2))
    with pytest.raises(ValueError, match="tree"):
        encode_retrieve(bad)
