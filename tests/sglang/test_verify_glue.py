"""Verify glue on CPU: SGLang's greedy tree kernel (Triton, interpreted) and the sampling kernel's reference,
fed by `encode_retrieve`, give through the glue the same accepted nodes, emitted tokens and KV keep-list as
the project's verifiers + `commit` (same trees, same logits, same seeds)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang_kernels

from ddtree.core.build import build_tree  # noqa: E402
from ddtree.core.retrieve import encode_retrieve  # noqa: E402
from ddtree.core.sampling import SamplingParams, process_logits  # noqa: E402
from ddtree.core.verify import commit, verify_greedy, verify_sampling  # noqa: E402
from ddtree.sglang.glue import (  # noqa: E402
    KernelOutputs,
    accepted_paths,
    merge_rows,
    tempered_draft_logits,
    verify_candidates,
    verify_positions,
)
from ddtree.sglang.kernel_reference import tree_speculative_sampling_target_only_reference  # noqa: E402

BLOCK = 5  # drafter block: D = 4 drafted positions, S = 5 accept_index columns
VOCAB = 11


def make_round(seed: int, batch: int = 4, budget: int = 12):
    """A tree from random draft logits and target logits that often agree with the drafter."""
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn((batch, BLOCK - 1, VOCAB), generator=g) * 2.0
    tree = build_tree(draft, budget)
    n = budget + 1
    target = torch.randn((batch, n, VOCAB), generator=g)
    # at each node, boost the drafter's next-position favourite so walks go deep
    depth = tree.depths.clamp(max=BLOCK - 2)  # [B, N] position the node's children are drafted at
    favourite = draft.argmax(-1).gather(1, depth)  # [B, N]
    target.scatter_add_(2, favourite.unsqueeze(2), torch.full((batch, n, 1), 3.0))
    bonus = torch.randint(0, VOCAB, (batch,), generator=g)
    return tree, target, bonus


def greedy_kernel(tree, candidates, enc, target_predict) -> KernelOutputs:
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    out = KernelOutputs.fresh(tree.batch_size, tree.num_columns, BLOCK, "cpu")
    verify_tree_greedy_triton(
        out.predicts, out.accept_index, out.accept_token_num, candidates,
        enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling, target_predict,
    )
    return out


def sampling_kernel(tree, candidates, enc, probs, coins, final) -> KernelOutputs:
    out = KernelOutputs.fresh(tree.batch_size, tree.num_columns, BLOCK, "cpu")
    draft_probs = torch.zeros_like(probs)  # fresh zeros each call, as the worker passes them
    tree_speculative_sampling_target_only_reference(
        out.predicts, out.accept_index, out.accept_token_num, candidates,
        enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling,
        coins, final, probs, draft_probs, 1.0, 1.0, True,
    )
    return out


def assert_same_commit(tree, paths, expected) -> None:
    n = tree.num_columns
    assert torch.equal(paths.accepted_nodes, expected.accepted_nodes)
    assert torch.equal(paths.emitted_tokens, expected.emitted_tokens)
    assert torch.equal(paths.commit_lens.to(torch.int64), expected.num_kept)
    flat = torch.where(
        expected.accepted_nodes >= 0,
        expected.accepted_nodes + torch.arange(tree.batch_size).unsqueeze(1) * n,
        -1,
    )
    assert torch.equal(paths.keep_index, flat)
    assert torch.equal(paths.bonus, expected.emitted_tokens.gather(1, expected.num_kept.unsqueeze(1) - 1).squeeze(1))


@pytest.mark.parametrize("seed", range(6))
def test_greedy_kernel_matches_verify_greedy(seed):
    tree, target, bonus = make_round(seed)
    enc = encode_retrieve(tree)
    candidates = verify_candidates(tree, bonus)
    out = greedy_kernel(tree, candidates, enc, target.argmax(-1))
    expected = commit(tree, verify_greedy(tree, target, max_depth=BLOCK - 1))
    assert int(expected.num_kept.max()) > 2  # the walks are not trivial
    assert_same_commit(tree, accepted_paths(out, tree.num_columns), expected)


@pytest.mark.parametrize("seed", range(8))
def test_mixed_batch_matches_the_core_sampling_verifier(seed):
    """Rows 0 and 2 greedy (SGLang's greedy kernel), rows 1 and 3 sampled (the sampling kernel's contract),
    merged per row; the core's verify_sampling draws its coins from the same seed in the same order."""
    tree, target, bonus = make_round(100 + seed)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7])
    params = SamplingParams(temperature=temperature, top_k=torch.tensor([-1, -1, -1, 5]), top_p=torch.tensor([1.0, 0.9, 1.0, 1.0]))
    expected = commit(
        tree,
        verify_sampling(tree, target, params, torch.Generator().manual_seed(seed), max_depth=BLOCK - 1, backend="reference"),
    )

    g = torch.Generator().manual_seed(seed)
    coins = torch.rand((tree.batch_size, tree.num_columns), generator=g)
    final = torch.rand((tree.batch_size,), generator=g)
    enc = encode_retrieve(tree)
    candidates = verify_candidates(tree, bonus)
    probs = process_logits(target, params)
    greedy_rows = temperature == 0
    out = merge_rows(
        greedy_rows,
        greedy_kernel(tree, candidates, enc, target.argmax(-1)),
        sampling_kernel(tree, candidates, enc, probs, coins, final),
    )
    assert_same_commit(tree, accepted_paths(out, tree.num_columns), expected)


def test_sampling_reference_is_strict_and_needs_target_mass():
    """One root with two children: coin exactly at the cumulative mass is rejected (strict <), and a child
    with zero target mass is never accepted even when the coin is 0."""
    candidates = torch.tensor([[0, 3, 4]])
    retrieve_index = torch.tensor([[0, 1, 2]])
    next_token = torch.tensor([[1, -1, -1]])
    next_sibling = torch.tensor([[-1, 2, -1]])
    probs = torch.zeros((1, 3, 6))
    probs[0, 0, 3] = 0.25
    probs[0, 0, 5] = 0.75
    probs[0, 1:, 0] = 1.0

    def run(coin0: float) -> KernelOutputs:
        out = KernelOutputs.fresh(1, 3, 3, "cpu")
        tree_speculative_sampling_target_only_reference(
            out.predicts, out.accept_index, out.accept_token_num, candidates, retrieve_index, next_token,
            next_sibling, torch.tensor([[coin0, 0.5, 0.5]]), torch.tensor([0.0]), probs, torch.zeros_like(probs),
        )
        return out

    below = run(0.2499)
    assert below.accept_index.tolist() == [[0, 1, -1]] and below.accept_token_num.tolist() == [1]
    at = run(0.25)  # u < acc fails at 0.25 == 0.25; token 4 has no mass: the bonus is drawn from the rest
    assert at.accept_token_num.tolist() == [0]
    assert at.predicts[0].item() == 5  # relu(target - rejected) leaves only token 5
    zero_coin = run(0.0)
    assert zero_coin.accept_token_num.tolist() == [1]  # token 3 has mass, 0 < 0.25


def test_positions_are_prefix_plus_depth():
    tree, _, _ = make_round(3)
    prefix = torch.tensor([7, 0, 30, 5])
    pos = verify_positions(prefix, tree.depths).view(tree.batch_size, -1)
    assert torch.equal(pos[:, 0], prefix)
    assert torch.equal(pos - prefix.unsqueeze(1), tree.depths)


def test_candidates_root_is_the_bonus_and_padding_is_a_valid_token():
    tree, _, bonus = make_round(4, budget=40)  # V = 11 over D = 4 cannot always fill 40: padding appears
    cand = verify_candidates(tree, bonus)
    assert torch.equal(cand[:, 0], bonus)
    real = tree.parents >= 0
    assert torch.equal(cand[real], tree.token_ids[real])
    assert bool((cand >= 0).all() and (cand < VOCAB).all())


def test_sampled_rows_draft_logits_at_the_tree_temperature():
    """SGLang's fields: a greedy request has top_k 1 (temperature 1.0): its logits stay raw; a sampled one's are
    divided by 1 + T, as in the reference engine (SGLang's normalised top_k: 1 << 30 for the whole vocabulary)."""
    draft = torch.randn(3, BLOCK - 1, VOCAB, dtype=torch.bfloat16)
    temperatures = torch.tensor([[1.0], [0.5], [1.0]])
    top_ks = torch.tensor([1, 1 << 30, 20], dtype=torch.int32)
    out = tempered_draft_logits(draft, temperatures, top_ks)
    assert out.dtype == draft.dtype
    assert torch.equal(out[0], draft[0])
    torch.testing.assert_close(out[1], draft[1] / 1.5)
    torch.testing.assert_close(out[2], draft[2] / 2)
