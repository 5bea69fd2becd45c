"""Tree attention: the mask is the ancestor closure (self included); padding rows see only themselves."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree.core.attention import ancestor_mask, tree_attention
from ddtree.core.build import build_tree
from ddtree.core.types import DDTreeBuildResult

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def trees(draw) -> DDTreeBuildResult:
    b, d, v = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    logits = torch.randn((b, d, v), generator=gen) * draw(st.sampled_from([0.3, 3.0, 30.0]))  # 30: deep chains
    return build_tree(logits, draw(st.integers(1, 70)), method=draw(st.sampled_from(["heap", "batched"])))


@HYP
@given(tree=trees(), seed=st.integers(0, 2**31 - 1))
def test_mask_is_the_ancestor_closure(tree: DDTreeBuildResult, seed: int, tree_tools) -> None:
    att = tree_attention(tree)
    b, n = tree.parents.shape
    assert att.mask.shape == (b, n, n) and att.mask.dtype == torch.bool
    assert torch.equal(att.mask, tree_tools.naive_ancestors(tree.parents))
    assert torch.equal(att.position_offsets, tree.depths) and att.position_offsets.dtype == torch.int64
    assert att.mask.any(-1).all(), "no fully masked row"
    assert torch.equal(att.mask.sum(-1), torch.where(tree.valid_mask(), tree.depths + 1, 1)), "depth + 1 visible"
    padding = ~tree.valid_mask()
    assert torch.equal(att.mask[padding], torch.eye(n, dtype=torch.bool).expand(b, n, n)[padding])
    permuted, _ = tree_tools.permute_columns(tree, torch.Generator().manual_seed(seed))
    assert torch.equal(tree_attention(permuted).mask, tree_tools.naive_ancestors(permuted.parents))


def test_deep_chain() -> None:
    # a chain of 300 nodes needs ceil(log2(301)) doubling rounds
    n = 301
    parents = torch.arange(-1, n - 1).unsqueeze(0)
    mask = ancestor_mask(parents)
    assert torch.equal(mask[0], torch.ones(n, n, dtype=torch.bool).tril())


def test_single_column() -> None:
    tree = build_tree(torch.randn(2, 3, 4), 1)
    att = tree_attention(tree)
    assert att.mask.shape == (2, 2, 2)
    assert att.mask.tolist() == [[[True, False], [True, True]]] * 2


def test_bad_tree_raises() -> None:
    with pytest.raises(ValueError, match="tree"):
        tree_attention(None)
    with pytest.raises(ValueError, match="parents"):
        ancestor_mask(torch.zeros(3, dtype=torch.int64))
