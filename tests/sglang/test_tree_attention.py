"""SGLang's Triton verify attention (`extend_attention_fwd`, as the Triton backend runs TARGET_VERIFY:
causal plus the custom mask, prefix part of the mask skipped) with the glue's tree mask equals a torch
reference of ancestor-only attention."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang_kernels

from ddtree.core.attention import ancestor_mask  # noqa: E402
from ddtree.core.build import build_tree  # noqa: E402
from ddtree.sglang.glue import verify_mask, verify_mask_numel  # noqa: E402

HEADS, KV_HEADS, DIM = 4, 2, 16


def reference(q, k_ext, v_ext, k_buf, v_buf, prefix_ids, parents) -> torch.Tensor:
    """Per request: node i attends to the committed prefix, itself and its ancestors."""
    n = parents.shape[1]
    anc = ancestor_mask(parents)  # [B, N, N]
    out = torch.empty_like(q)
    group = HEADS // KV_HEADS
    for b, ids in enumerate(prefix_ids):
        rows = slice(b * n, (b + 1) * n)
        keys = torch.cat([k_buf[ids], k_ext[rows]]).repeat_interleave(group, dim=1)  # [L + N, H, D]
        vals = torch.cat([v_buf[ids], v_ext[rows]]).repeat_interleave(group, dim=1)
        allowed = torch.cat([torch.ones((n, len(ids)), dtype=torch.bool), anc[b]], dim=1)  # [N, L + N]
        scores = torch.einsum("nhd,khd->hnk", q[rows], keys) / DIM**0.5
        scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
        out[rows] = torch.einsum("hnk,khd->nhd", scores.softmax(-1), vals)
    return out


def test_triton_verify_attention_with_tree_mask_matches_ancestor_attention():
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    g = torch.Generator().manual_seed(0)
    budget, block, vocab = 8, 4, 5
    tree = build_tree(torch.randn((2, block - 1, vocab), generator=g) * 3, budget)
    parents = tree.parents
    n = budget + 1
    assert bool((tree.depths.max(dim=1).values >= 2).all())  # real branching trees, not chains
    seq_lens = torch.tensor([6, 3])
    pool = 32
    k_buf = torch.randn((pool, KV_HEADS, DIM), generator=g)
    v_buf = torch.randn((pool, KV_HEADS, DIM), generator=g)
    prefix_ids = [torch.tensor([3, 9, 4, 20, 11, 7]), torch.tensor([15, 2, 30])]
    q = torch.randn((2 * n, HEADS, DIM), generator=g)
    k_ext = torch.randn((2 * n, KV_HEADS, DIM), generator=g)
    v_ext = torch.randn((2 * n, KV_HEADS, DIM), generator=g)

    qo_indptr = torch.tensor([0, n, 2 * n], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 6, 9], dtype=torch.int32)
    kv_indices = torch.cat(prefix_ids).to(torch.int64)
    mask_lens = n * (seq_lens + n)
    mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), mask_lens.cumsum(0)]).to(torch.int32)
    mask = verify_mask(parents, seq_lens, int(verify_mask_numel(seq_lens, n)))
    assert mask.numel() == int(mask_lens.sum())

    def run(custom_mask):
        out = torch.zeros_like(q)
        extend_attention_fwd(
            q, k_ext, v_ext, out, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, custom_mask, True,
            mask_indptr, n, 1.0, 1.0, skip_prefix_custom_mask=True,
        )
        return out

    expected = reference(q, k_ext, v_ext, k_buf, v_buf, prefix_ids, parents)
    torch.testing.assert_close(run(mask), expected, rtol=1e-5, atol=1e-5)
    # without the mask the kernel runs a causal chain over the N nodes: a different result
    assert (run(None) - expected).abs().max() > 1e-2
