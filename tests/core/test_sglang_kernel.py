"""The SGLang kernel adapter and the pure-torch reference of the kernel.

The reference is checked against a plain per-request transcription of the kernel law on the same
coins; the adapter's lossless law is tested in test_verify (backend="reference"). When SGLang's
kernel is importable and CUDA is present, the real kernel is compared with the reference.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ddtree.core.retrieve import encode_retrieve
from ddtree.core.sampling import SamplingParams, process_logits
from ddtree.core.sglang_kernel import (
    KERNEL_ARG_ORDER,
    draw_coins,
    kernel_outputs_to_verify_result,
    load_sglang_kernel,
    prepare_kernel_args,
    reference_tree_speculative_sampling_target_only,
    verify_with_kernel,
)
from ddtree.core.verify import verify_sampling
from ddtree.testing.trees import Node, batch_trees, children_of, naive_encode_retrieve, random_tree


def naive_kernel_row(nodes, probs: np.ndarray, coins: np.ndarray, final_coin: float, steps: int):
    """One request of the kernel law, written out with Python loops (float32 sums, as the kernel)."""
    kids = children_of(nodes)
    cur, coin, path = 0, coins[0], [0]
    rejected: list[int] = []
    for _ in range(1, steps):
        acc = np.float32(0.0)
        rejected = []
        moved = False
        for child in kids[cur]:
            p = probs[cur, nodes[child].token]
            acc = np.float32(acc + p)
            if coin <= acc or p >= 1.0:
                cur, coin, moved = child, coins[child], True
                path.append(child)
                break
            rejected.append(nodes[child].token)
        if not moved:
            break
    residual = probs[cur].astype(np.float32).copy()
    if len(path) - 1 != steps - 1:
        residual[rejected] = 0.0
    u = np.float32(final_coin) * residual.sum(dtype=np.float32)
    cdf = np.cumsum(residual, dtype=np.float32)
    hits = np.nonzero((cdf > u) & (residual > 0))[0]
    bonus = int(hits[0]) if len(hits) else int(np.nonzero(residual > 0)[0][-1])
    return path, bonus


def _case(seed: int, batch: int = 48, cols: int = 14, vocab: int = 7, depth: int = 4):
    rng = random.Random(seed)
    trees = [random_tree(rng.randint(1, cols), vocab, depth, rng) for _ in range(batch)]
    tree = batch_trees(trees, cols)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, cols, vocab, generator=gen)
    for b, nodes in enumerate(trees):
        for node in nodes[1:]:
            logits[b, node.parent, node.token] += 2.0
    return trees, tree, logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_kernel_matches_the_per_request_law(seed):
    trees, tree, logits = _case(seed)
    probs = process_logits(logits, SamplingParams(1.0, 5, 0.95))
    coins, final = draw_coins(tree.batch_size, tree.num_columns, probs.device, torch.Generator().manual_seed(seed))
    result = verify_with_kernel(tree, encode_retrieve(tree), probs,
                                kernel=reference_tree_speculative_sampling_target_only, max_depth=4,
                                coins=(coins, final))
    for b, nodes in enumerate(trees):
        path, bonus = naive_kernel_row(nodes, probs[b].numpy(), coins[b].numpy(), float(final[b]), 5)
        assert result.accepted_nodes[b].tolist() == path + [-1] * (5 - len(path)), b
        assert result.accept_len[b].item() == len(path) - 1
        assert result.bonus_token[b].item() == bonus, b


def test_depth_limit_stops_the_walk_without_draft_probs():
    trees, tree, logits = _case(3, depth=5)
    probs = process_logits(logits, SamplingParams(0.6))
    coins, final = draw_coins(tree.batch_size, tree.num_columns, probs.device, torch.Generator().manual_seed(3))
    result = verify_with_kernel(tree, encode_retrieve(tree), probs,
                                kernel=reference_tree_speculative_sampling_target_only, max_depth=2,
                                coins=(coins, final))
    assert result.accepted_nodes.shape == (tree.batch_size, 3)
    for b, nodes in enumerate(trees):
        path, bonus = naive_kernel_row(nodes, probs[b].numpy(), coins[b].numpy(), float(final[b]), 3)
        assert result.accepted_nodes[b].tolist() == path + [-1] * (3 - len(path))
        assert result.bonus_token[b].item() == bonus


def test_prepare_kernel_args_layout():
    _, tree, logits = _case(4, batch=3)
    probs = process_logits(logits, SamplingParams(1.0))
    coins, final = draw_coins(3, tree.num_columns, probs.device)
    args = prepare_kernel_args(tree, encode_retrieve(tree), probs, coins, final, max_depth=4)
    assert list(args) == list(KERNEL_ARG_ORDER)
    assert args["predicts"].shape == (3 * tree.num_columns,) and args["predicts"].dtype == torch.int32
    assert args["accept_index"].shape == (3, 5) and args["accept_index"].dtype == torch.int32
    assert args["accept_token_num"].dtype == torch.int32
    for name in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling"):
        assert args[name].dtype == torch.int64 and args[name].shape == (3, tree.num_columns)
    assert (args["candidates"] >= 0).all()
    assert args["draft_probs"].shape == probs.shape and not args["draft_probs"].any()
    assert args["draft_probs"].data_ptr() != probs.data_ptr()


def test_reference_writes_rejected_children_into_draft_probs():
    # The root's children carry tokens 0 (p = 0.2) and 1 (p = 0.3); coin 0.9 rejects both, so the
    # bonus is drawn from the rest (token 2 or 3) and both rejected probs land in draft_probs.
    tree = batch_trees([[Node(-1, -1, 0.0, 0), Node(0, 0, -0.5, 1), Node(0, 1, -0.7, 1)]])
    probs = torch.zeros(1, 3, 4)
    probs[0, 0] = torch.tensor([0.2, 0.3, 0.4, 0.1])
    probs[0, 1:, 0] = 1.0
    args = prepare_kernel_args(tree, encode_retrieve(tree), probs, torch.full((1, 3), 0.9), torch.tensor([0.5]), 1)
    reference_tree_speculative_sampling_target_only(*(args[n] for n in KERNEL_ARG_ORDER))
    assert args["accept_token_num"].tolist() == [0]
    assert torch.allclose(args["draft_probs"][0, 0], torch.tensor([0.2, 0.3, 0.0, 0.0]))
    assert args["predicts"][0].item() == 2  # u = 0.5 * 0.5 = 0.25 < cdf(token 2) = 0.4


def test_adapter_conversion_from_flat_ids():
    _, tree, _ = _case(5, batch=2, cols=4)
    cols = tree.num_columns
    accept_index = torch.tensor([[0, 2, -1], [cols, cols + 1, cols + 3]], dtype=torch.int32)
    accept_token_num = torch.tensor([1, 2], dtype=torch.int32)
    predicts = torch.arange(2 * cols, dtype=torch.int32) + 100
    result = kernel_outputs_to_verify_result(tree, accept_index, accept_token_num, predicts, torch.zeros(2))
    assert result.accepted_nodes.tolist() == [[0, 2, -1], [0, 1, 3]]
    assert result.accept_len.tolist() == [1, 2]
    assert result.bonus_token.tolist() == [102, 100 + cols + 3]


def test_naive_and_real_retrieve_encoders_agree_on_fixtures():
    _, tree, _ = _case(6)
    ours, theirs = naive_encode_retrieve(tree), encode_retrieve(tree)
    for field in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field


def test_sglang_kernel_is_unavailable_without_cuda_sglang():
    if torch.cuda.is_available():
        pytest.skip("CUDA host: availability depends on the installed sglang")
    assert load_sglang_kernel() is None


@pytest.mark.skipif(load_sglang_kernel() is None or not torch.cuda.is_available(),
                    reason="SGLang's tree_speculative_sampling_target_only is not importable on CUDA here")
def test_real_kernel_agrees_with_reference():
    trees, tree, logits = _case(7, batch=256)
    tree_cuda = type(tree)(*(getattr(tree, f).cuda() for f in
                             ("token_ids", "parents", "depths", "node_logws", "num_nodes")))
    probs = process_logits(logits.cuda(), SamplingParams(1.0))
    coins, final = draw_coins(256, tree.num_columns, probs.device)
    enc = encode_retrieve(tree_cuda)
    real = verify_with_kernel(tree_cuda, enc, probs, kernel=load_sglang_kernel(), max_depth=4, coins=(coins, final))
    ref = verify_with_kernel(tree_cuda, enc, probs, kernel=reference_tree_speculative_sampling_target_only,
                             max_depth=4, coins=(coins, final))
    same = (real.accepted_nodes == ref.accepted_nodes).all(1) & (real.bonus_token == ref.bonus_token)
    assert same.float().mean().item() >= 0.99  # float-sum order may flip rare boundary coins
    result = verify_sampling(tree_cuda, logits.cuda(), SamplingParams(1.0), backend="sglang", max_depth=4)
    assert result.accepted_nodes.shape == (256, 5)
