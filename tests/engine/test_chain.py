"""DFlash's chain expressed as a DDTreeBuildResult."""

from __future__ import annotations

import pytest
import torch

from ddtree.engine.chain import build_chain


def test_chain_structure_and_scores():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)  # [B, D, V]
    tree = build_chain(logits)
    assert tree.token_ids.shape == (2, 6)
    assert torch.equal(tree.token_ids[:, 0], torch.full((2,), -1))
    assert torch.equal(tree.token_ids[:, 1:], logits.argmax(-1))
    assert torch.equal(tree.parents[0], torch.tensor([-1, 0, 1, 2, 3, 4]))
    assert torch.equal(tree.depths[1], torch.arange(6))
    assert torch.equal(tree.num_nodes, torch.tensor([6, 6]))
    logp = torch.log_softmax(logits, -1).max(-1).values.cumsum(-1)  # [B, D]
    assert torch.allclose(tree.node_logws[:, 1:], logp)
    assert torch.all(tree.node_logws[:, 0] == 0)
    assert bool(tree.valid_mask().all())


def test_chain_rejects_bad_input():
    with pytest.raises(ValueError, match="draft_logits"):
        build_chain(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="D=0"):
        build_chain(torch.zeros(1, 0, 4))
