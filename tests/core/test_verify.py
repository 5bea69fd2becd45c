"""Greedy walk, lossless sample-and-walk, the shared commit path and input validation.

Statistical tests use a chi-square goodness-of-fit test at alpha = 1e-3 (cells with an expected count
below 5 merged into one) and a two-sided z-test at alpha = 1e-3 for the mean accept length. Every
test is seeded, so it is deterministic; alpha is the chance that a correct verifier fails it.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from ddtree.core.sampling import SamplingParams, process_logits
from ddtree.core.types import DDTreeBuildResult
from ddtree.core.verify import commit, verify_greedy, verify_sampling
from ddtree.testing.nosync import NoHostSync
from ddtree.testing.trees import Node, batch_trees, children_of, example_tree, random_tree, repeat_tree

try:
    from tests.core.test_sampling import naive_process_row
except ImportError:  # pytest run without the repository root on sys.path
    from test_sampling import naive_process_row

ALPHA = 1e-3


# ---------------------------------------------------------------- naive references


def naive_walk(nodes: list[Node], picks_at: list[int], max_depth: int) -> tuple[list[int], int]:
    """Per-request walk: (accepted node indices root first, bonus) given the pick at every node."""
    kids = children_of(nodes)
    path = [0]
    while True:
        cur = path[-1]
        nxt = [c for c in kids[cur] if nodes[c].token == picks_at[cur]] if nodes[cur].depth < max_depth else []
        if not nxt:
            return path, picks_at[cur]
        path.append(nxt[0])


def exact_emission_law(nodes: list[Node], probs: np.ndarray, max_depth: int) -> tuple[dict[tuple, float], float]:
    """Law of the emitted sequence (path tokens + bonus) and E[accept_len], enumerated exactly.

    P(end at node u with bonus x) = P(path to u) * p_u(x) for x not a child token of u.
    """
    kids = children_of(nodes)
    law: dict[tuple, float] = {}
    expected = 0.0
    stack = [(0, 1.0, ())]
    while stack:
        u, p_path, tokens = stack.pop()
        if u != 0:
            expected += p_path
        child_tokens = {nodes[c].token: c for c in kids[u]} if nodes[u].depth < max_depth else {}
        for x in range(probs.shape[1]):
            if x in child_tokens:
                stack.append((child_tokens[x], p_path * probs[u, x], tokens + (x,)))
            elif probs[u, x] > 0:
                law[tokens + (x,)] = law.get(tokens + (x,), 0.0) + p_path * probs[u, x]
    return law, expected


def emitted_sequences(tree: DDTreeBuildResult, result) -> list[tuple]:
    out = commit(tree, result)
    rows = out.emitted_tokens.tolist()
    return [tuple(row[:n]) for row, n in zip(rows, out.num_emitted.tolist())]


def chi_square_pvalue(observed: Counter, law: dict[tuple, float], total: int) -> float:
    assert set(observed) <= set(law), f"impossible sequences emitted: {set(observed) - set(law)}"
    keys = sorted(law, key=lambda k: -law[k])
    exp = np.array([law[k] * total for k in keys])
    obs = np.array([observed.get(k, 0) for k in keys], dtype=float)
    big = exp >= 5
    exp_cells = np.append(exp[big], exp[~big].sum())
    obs_cells = np.append(obs[big], obs[~big].sum())
    if exp_cells[-1] < 5:  # fold the small remainder into the last big cell
        exp_cells[-2] += exp_cells[-1]
        obs_cells[-2] += obs_cells[-1]
        exp_cells, obs_cells = exp_cells[:-1], obs_cells[:-1]
    exp_cells *= obs_cells.sum() / exp_cells.sum()  # law sums to 1 up to float rounding
    return float(stats.chisquare(obs_cells, exp_cells).pvalue)


def assert_lossless(tree_nodes, tree, row_logits, params_row, result, max_depth):
    """Chi-square on the emitted law and z-test on the mean accept length (both alpha = ALPHA)."""
    probs = naive_process_probs(row_logits, params_row)
    law, expected = exact_emission_law(tree_nodes, probs, max_depth)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    rows = tree.batch_size
    pvalue = chi_square_pvalue(Counter(emitted_sequences(tree, result)), law, rows)
    assert pvalue > ALPHA, f"emitted law differs from the target law (p = {pvalue:.2e})"
    np.testing.assert_allclose(result.expected_accept_len.numpy(), expected, rtol=1e-5)
    acc = result.accept_len.double()
    z = (acc.mean().item() - expected) / (acc.std().item() / rows**0.5)
    assert abs(z) < stats.norm.ppf(1 - ALPHA / 2), f"mean accept_len off by z = {z:.2f}"


def naive_process_probs(row_logits: torch.Tensor, params_row: tuple) -> np.ndarray:
    """Processed target probabilities of every node row by the plain per-row reference."""
    t, k, p = params_row
    return np.stack([naive_process_row(r, t, k, p) for r in row_logits.double().numpy()])


# ---------------------------------------------------------------- greedy


def test_greedy_matches_naive_walk_on_random_trees():
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        trees = [random_tree(rng.randint(1, 14), 5, 4, rng) for _ in range(16)]
        tree = batch_trees(trees, 16)
        logits = torch.randn(16, 16, 5, generator=gen)
        # bias half the rows towards the tree so long walks happen
        for b, nodes in enumerate(trees):
            for i, node in enumerate(nodes[1:], start=1):
                if rng.random() < 0.7:
                    logits[b, node.parent, node.token] += 3.0
        result = verify_greedy(tree, logits, max_depth=4)
        picks = logits.argmax(-1).tolist()
        for b, nodes in enumerate(trees):
            path, bonus = naive_walk(nodes, picks[b], 4)
            assert result.accepted_nodes[b].tolist() == path + [-1] * (5 - len(path))
            assert result.accept_len[b].item() == len(path) - 1
            assert result.bonus_token[b].item() == bonus
        assert torch.equal(result.expected_accept_len, result.accept_len.float())


def test_greedy_max_depth_truncates_the_walk_and_default_reads_tree_depth():
    tree = batch_trees([[Node(-1, -1, 0.0, 0), Node(0, 1, -0.1, 1), Node(1, 2, -0.2, 2), Node(2, 3, -0.3, 3)]])
    logits = torch.zeros(1, 4, 5)
    for i, tok in enumerate([1, 2, 3, 4]):
        logits[0, i, tok] = 5.0
    full = verify_greedy(tree, logits)
    assert full.accepted_nodes.tolist() == [[0, 1, 2, 3]] and full.bonus_token.item() == 4
    short = verify_greedy(tree, logits, max_depth=1)
    assert short.accepted_nodes.tolist() == [[0, 1]] and short.bonus_token.item() == 2
    assert short.expected_accept_len.item() == 1.0
    wide = verify_greedy(tree, logits, max_depth=6)
    assert wide.accepted_nodes.tolist() == [[0, 1, 2, 3, -1, -1, -1]]


def test_commit_emits_accepted_tokens_then_bonus():
    nodes = example_tree()
    tree = batch_trees([nodes, nodes[:1]], 10)
    logits = torch.zeros(2, 10, 6)
    logits[0, 0, 2] = logits[0, 1, 3] = logits[0, 3, 4] = logits[0, 6, 0] = 9.0  # root->1->3->6, bonus 0
    logits[1, 0, 5] = 9.0
    result = verify_greedy(tree, logits, max_depth=3)
    out = commit(tree, result)
    assert out.accepted_nodes.tolist() == [[0, 1, 3, 6], [0, -1, -1, -1]]
    assert out.emitted_tokens.tolist() == [[2, 3, 4, 0], [5, -1, -1, -1]]
    assert out.num_kept.tolist() == [4, 1] and out.num_emitted.tolist() == [4, 1]


# ---------------------------------------------------------------- sampling: lossless


def _random_case(seed: int, vocab: int = 6, num_nodes: int = 12, depth: int = 4):
    rng = random.Random(seed)
    nodes = random_tree(num_nodes, vocab, depth, rng)
    gen = torch.Generator().manual_seed(seed)
    row_logits = torch.randn(num_nodes, vocab, generator=gen)
    for node in nodes[1:]:  # make tree tokens likely so deep paths are exercised
        row_logits[node.parent, node.token] += 2.0
    return nodes, row_logits


ROWS = 20_000
PARAM_CASES = [
    (0.5, -1, 1.0),
    (1.0, -1, 1.0),
    (1.5, -1, 1.0),
    (1.0, 3, 1.0),
    (1.0, -1, 0.8),
    (0.8, 4, 0.9),
]


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("params_row", PARAM_CASES)
def test_sampling_is_lossless(params_row, backend):
    nodes, row_logits = _random_case(seed=11)
    tree = repeat_tree(nodes, ROWS)
    logits = row_logits.expand(ROWS, -1, -1).contiguous()
    gen = torch.Generator().manual_seed(123)
    result = verify_sampling(tree, logits, SamplingParams(*params_row), gen, max_depth=4, backend=backend)
    assert_lossless(nodes, tree, row_logits, params_row, result, 4)


def test_sampling_is_lossless_on_a_built_tree():
    from ddtree.core.build import build_tree

    gen = torch.Generator().manual_seed(5)
    draft_logits = torch.randn(1, 3, 5, generator=gen) * 2
    one = build_tree(draft_logits, 10, method="heap")
    n = int(one.num_nodes[0])
    nodes = [Node(int(one.parents[0, i]), int(one.token_ids[0, i]), float(one.node_logws[0, i]),
                  int(one.depths[0, i])) for i in range(n)]
    tree = DDTreeBuildResult(*(getattr(one, f).expand(ROWS, *getattr(one, f).shape[1:]).contiguous()
                               for f in ("token_ids", "parents", "depths", "node_logws", "num_nodes")))
    row_logits = torch.randn(one.num_columns, 5, generator=gen)
    logits = row_logits.expand(ROWS, -1, -1).contiguous()
    result = verify_sampling(tree, logits, SamplingParams(1.0), torch.Generator().manual_seed(9), max_depth=3)
    assert_lossless(nodes, tree, row_logits, (1.0, -1, 1.0), result, 3)


def test_temperature_zero_rows_equal_greedy():
    rng = random.Random(3)
    trees = [random_tree(rng.randint(1, 12), 6, 4, rng) for _ in range(32)]
    tree = batch_trees(trees, 12)
    logits = torch.randn(32, 12, 6, generator=torch.Generator().manual_seed(3)) * 3
    greedy = verify_greedy(tree, logits, max_depth=4)
    for backend in ("torch", "reference"):
        sampled = verify_sampling(tree, logits, SamplingParams(0.0), max_depth=4, backend=backend)
        for field in ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len"):
            assert torch.equal(getattr(sampled, field), getattr(greedy, field)), field


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_mixed_greedy_and_sampled_rows(backend):
    nodes, row_logits = _random_case(seed=21)
    rows = 2 * ROWS
    tree = repeat_tree(nodes, rows)
    logits = row_logits.expand(rows, -1, -1).contiguous()
    temperature = torch.where(torch.arange(rows) % 2 == 0, 0.0, 1.2)
    params = SamplingParams(temperature, torch.full((rows,), -1), torch.ones(rows))
    result = verify_sampling(tree, logits, params, torch.Generator().manual_seed(4), max_depth=4, backend=backend)
    greedy = verify_greedy(repeat_tree(nodes, 1), row_logits.unsqueeze(0), max_depth=4)
    even = torch.arange(0, rows, 2)
    assert torch.equal(result.accepted_nodes[even], greedy.accepted_nodes.expand(len(even), -1))
    assert torch.equal(result.bonus_token[even], greedy.bonus_token.expand(len(even)))
    assert torch.equal(result.expected_accept_len[even], greedy.expected_accept_len.expand(len(even)))
    odd = torch.arange(1, rows, 2)
    sub_tree = repeat_tree(nodes, len(odd))
    sub = type(result)(*(getattr(result, f)[odd] for f in
                         ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len")))
    assert_lossless(nodes, sub_tree, row_logits, (1.2, -1, 1.0), sub, 4)


def test_sampling_is_reproducible_with_a_seeded_generator():
    nodes, row_logits = _random_case(seed=2)
    tree = repeat_tree(nodes, 64)
    logits = row_logits.expand(64, -1, -1).contiguous()
    a = verify_sampling(tree, logits, SamplingParams(1.0), torch.Generator().manual_seed(7))
    b = verify_sampling(tree, logits, SamplingParams(1.0), torch.Generator().manual_seed(7))
    assert torch.equal(a.accepted_nodes, b.accepted_nodes) and torch.equal(a.bonus_token, b.bonus_token)


def test_expected_accept_len_equals_sum_of_path_probabilities():
    nodes, row_logits = _random_case(seed=8)
    tree = repeat_tree(nodes, 1)
    params = SamplingParams(0.7, 4, 0.95)
    result = verify_sampling(tree, row_logits.unsqueeze(0), params, max_depth=4)
    probs = process_logits(row_logits.unsqueeze(0), params)[0].double().numpy()
    _, expected = exact_emission_law(nodes, probs, 4)
    assert result.expected_accept_len.item() == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------- validation


def _small():
    return batch_trees([example_tree(), example_tree()[:3]], 8), torch.randn(2, 8, 6)


@pytest.mark.parametrize("verifier", ["greedy", "sampling"])
@pytest.mark.parametrize(
    "make_logits, word",
    [
        (lambda lg: lg[0], "target_logits must have rank 3"),
        (lambda lg: lg[:1], "target_logits"),
        (lambda lg: lg[:, :5], "target_logits"),
        (lambda lg: lg.to(torch.int64), "target_logits"),
        (lambda lg: torch.where(lg > 1.5, float("nan"), lg), "target_logits"),
        (lambda lg: torch.where(lg > 1.5, float("inf"), lg), "target_logits"),
        (lambda lg: lg.to("meta"), "target_logits"),
        (lambda lg: [[1.0]], "target_logits"),
    ],
)
def test_bad_target_logits_raise(verifier, make_logits, word):
    tree, logits = _small()
    bad = make_logits(logits)
    with pytest.raises(ValueError, match=word):
        if verifier == "greedy":
            verify_greedy(tree, bad)
        else:
            verify_sampling(tree, bad, SamplingParams(1.0))


def test_bad_arguments_raise():
    tree, logits = _small()
    with pytest.raises(ValueError, match="tree"):
        verify_greedy("tree", logits)
    with pytest.raises(ValueError, match="params"):
        verify_sampling(tree, logits, {"temperature": 1.0})
    with pytest.raises(ValueError, match="temperature"):
        verify_sampling(tree, logits, SamplingParams(torch.ones(3)))
    with pytest.raises(ValueError, match="max_depth"):
        verify_greedy(tree, logits, max_depth=-1)
    with pytest.raises(ValueError, match="backend"):
        verify_sampling(tree, logits, SamplingParams(1.0), backend="cuda")
    with pytest.raises(ValueError, match="backend='sglang'"):
        verify_sampling(tree, logits, SamplingParams(1.0), backend="sglang")
    with pytest.raises(ValueError, match="verify_result"):
        commit(tree, "result")


def test_verifiers_do_not_modify_target_logits():
    tree, logits = _small()
    before = logits.clone()
    verify_greedy(tree, logits)
    verify_sampling(tree, logits, SamplingParams(1.0, 3, 0.9), backend="torch")
    verify_sampling(tree, logits, SamplingParams(1.0), backend="reference")
    assert torch.equal(logits, before)


class _Float32Allocations(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the storages of every fp32 tensor of at least `numel` elements an op returns."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel = numel
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in torch.utils._pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.dtype == torch.float32 and leaf.numel() >= self.numel:
                self.storages.add(leaf.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("params", [SamplingParams(0.8), SamplingParams(torch.tensor([0.0, 1.3]), 3, 1.0)])
def test_sampling_path_allocates_one_full_size_fp32_buffer(params):
    tree, logits = _small()
    logits = logits.to(torch.bfloat16)
    with _Float32Allocations(logits.numel()) as mode:
        verify_sampling(tree, logits, params, torch.Generator().manual_seed(0), backend="torch")
    assert len(mode.storages) == 1


# ---------------------------------------------------------------- capture-safe calls (validate=False)


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(0.8), SamplingParams(0.8, 4, 0.9),
                                    SamplingParams(torch.tensor([0.0, 1.3, 0.7]), torch.tensor([3, -1, 2]), 1.0)])
def test_unvalidated_verify_and_commit_equal_the_checked_calls_without_host_reads(params):
    nodes, row_logits = _random_case(seed=31)
    tree = repeat_tree(nodes, 3)
    logits = row_logits.expand(3, -1, -1).contiguous()
    want_greedy = verify_greedy(tree, logits, max_depth=4)
    want = verify_sampling(tree, logits, params, torch.Generator().manual_seed(4), max_depth=4)
    want_commit = commit(tree, want)
    generator = torch.Generator().manual_seed(4)
    with NoHostSync():
        greedy = verify_greedy(tree, logits, max_depth=4, validate=False)
        got = verify_sampling(tree, logits, params, generator, max_depth=4, validate=False)
        got_commit = commit(tree, got)
    for field in ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len"):
        assert torch.equal(getattr(greedy, field), getattr(want_greedy, field)), field
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    for field in ("accepted_nodes", "num_kept", "emitted_tokens", "num_emitted"):
        assert torch.equal(getattr(got_commit, field), getattr(want_commit, field)), field


def test_unvalidated_verify_needs_an_explicit_max_depth():
    nodes, row_logits = _random_case(seed=32)
    tree, logits = repeat_tree(nodes, 2), row_logits.expand(2, -1, -1).contiguous()
    with pytest.raises(ValueError, match="max_depth"):
        verify_greedy(tree, logits, validate=False)
    with pytest.raises(ValueError, match="max_depth"):
        verify_sampling(tree, logits, SamplingParams(1.0), validate=False)
