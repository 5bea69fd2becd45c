"""The Triton lazy sample-and-walk (`verify_sampling(backend="triton")`, core/triton_verify.py).

Runs on CUDA with triton, or on CPU with triton under TRITON_INTERPRET=1; else skips. Lossless statistics as
in test_verify: chi-square and z-test at alpha 1e-3.
"""

from __future__ import annotations

import pytest
import torch

from ddtree.core.sampling import SamplingParams
from ddtree.core.verify import verify_greedy, verify_sampling
from ddtree.testing.trees import Node, children_of, repeat_tree

try:
    from tests.core.test_sglang_kernel import _case
    from tests.core.test_verify import ROWS, _random_case, assert_lossless
except ImportError:
    from test_sglang_kernel import _case
    from test_verify import ROWS, _random_case, assert_lossless

# ---------------------------------------------------------------- fused Triton sampler
# Runs on CUDA with triton, or on CPU with triton under TRITON_INTERPRET=1 (slow: about 25 s per
# 20,000-row lossless case). Lossless statistics as in test_verify: chi-square and z-test at alpha 1e-3.

FUSED_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _lazy_usable() -> bool:
    try:
        from ddtree.core.triton_verify import lazy_walk_usable
    except ImportError:
        return False
    return lazy_walk_usable(FUSED_DEVICE)


fused = lazy = pytest.mark.skipif(not _lazy_usable(), reason="lazy Triton walk not usable here (no triton / CUDA)")


def _to(tree, device):
    return type(tree)(*(getattr(tree, f).to(device) for f in
                        ("token_ids", "parents", "depths", "node_logws", "num_nodes")))


@fused
def test_fused_sampler_greedy_rows_and_expectation_match_torch():
    trees, tree, logits = _case(8, batch=64)
    tree, logits = _to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE)
    temperature = torch.where(torch.arange(64, device=FUSED_DEVICE) % 2 == 0, 0.0, 0.9)
    params = SamplingParams(temperature)
    fused_result = verify_sampling(tree, logits, params, max_depth=4, backend="triton")
    torch_result = verify_sampling(tree, logits, params, max_depth=4, backend="torch")
    greedy = verify_greedy(tree, logits, max_depth=4)
    even = torch.arange(0, 64, 2, device=FUSED_DEVICE)
    assert torch.equal(fused_result.accepted_nodes[even], greedy.accepted_nodes[even])
    assert torch.equal(fused_result.bonus_token[even], greedy.bonus_token[even])
    torch.testing.assert_close(fused_result.expected_accept_len, torch_result.expected_accept_len,
                               rtol=1e-4, atol=1e-5)


@fused
def test_fused_sampler_refuses_top_k_and_top_p():
    _, tree, logits = _case(9, batch=2)
    with pytest.raises(ValueError, match="backend='triton'"):
        verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), SamplingParams(1.0, 5, 1.0),
                        backend="triton")
    with pytest.raises(ValueError, match="backend='triton'"):
        verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), SamplingParams(1.0, -1, 0.9),
                        backend="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lazy_walk_compiles_on_cuda_when_triton_imports():
    pytest.importorskip("triton")
    from ddtree.core.triton_verify import TRITON_PROBE_ERRORS, lazy_walk_usable

    assert lazy_walk_usable(FUSED_DEVICE), TRITON_PROBE_ERRORS.get(f"lazy:{FUSED_DEVICE}")


def test_triton_backend_unusable_raises_on_plain_cpu():
    if _lazy_usable():
        pytest.skip("the Triton walk is usable here")
    _, tree, logits = _case(9, batch=2)
    with pytest.raises(ValueError, match="backend='triton'"):
        verify_sampling(tree, logits, SamplingParams(1.0), backend="triton")


@fused
def test_triton_backend_rejects_non_finite_logits():
    _, tree, logits = _case(8, batch=4)
    logits = logits.clone()
    logits[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="target_logits"):
        verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), SamplingParams(1.0), backend="triton")


# ---------------------------------------------------------------- lazy sample-and-walk (preferred fused path)
# Same statistics (chi-square on the emitted law and z-test on the mean accept length, alpha = 1e-3).
# On CUDA each case has 20,000 rows. Under TRITON_INTERPRET=1 the interpreter runs one program at a time
# (about 15 ms per row of a 4-node tree), so a case has LAZY_ROWS = 6,000 rows (~90 s): with ~25 cells the
# chi-square test then detects a chi-square distance sum((q - p)^2 / p) >= 8.3e-3 with power 0.93
# (2.5e-3 at 20,000 rows).


LAZY_ROWS = ROWS if FUSED_DEVICE.type == "cuda" else 6_000


def _lazy_case(seed: int):
    """A small case (4 nodes, V = 8): the Triton interpreter runs the lazy walk one program at a time."""
    return _random_case(seed, vocab=8, num_nodes=4, depth=3)


def _cpu(result):
    return type(result)(*(getattr(result, f).cpu() for f in
                          ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len")))


def _lazy_verify(tree, logits, params, seed, max_depth):
    gen = torch.Generator(device=FUSED_DEVICE).manual_seed(seed)
    return _cpu(verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), params, gen,
                                max_depth=max_depth, backend="triton"))


@lazy
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
def test_lazy_walk_is_lossless(temperature):
    nodes, row_logits = _lazy_case(seed=4)
    depth = max(n.depth for n in nodes)
    tree = repeat_tree(nodes, LAZY_ROWS)
    logits = row_logits.expand(LAZY_ROWS, -1, -1).contiguous()
    result = _lazy_verify(tree, logits, SamplingParams(temperature), 5, depth)
    assert_lossless(nodes, tree, row_logits, (temperature, -1, 1.0), result, depth)


@lazy
def test_lazy_walk_mixed_batch_greedy_rows_equal_verify_greedy_and_sampled_rows_are_lossless():
    nodes, row_logits = _lazy_case(seed=6)
    depth = max(n.depth for n in nodes)
    rows = 2 * (LAZY_ROWS // 2)
    tree = repeat_tree(nodes, rows)
    logits = row_logits.expand(rows, -1, -1).contiguous()
    temperature = torch.where(torch.arange(rows) % 2 == 0, 0.0, 1.2)
    result = _lazy_verify(tree, logits, SamplingParams(temperature.to(FUSED_DEVICE)), 7, depth)
    greedy = verify_greedy(repeat_tree(nodes, 1), row_logits.unsqueeze(0), max_depth=depth)
    even, odd = torch.arange(0, rows, 2), torch.arange(1, rows, 2)
    for field in ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len"):
        want = getattr(greedy, field)
        assert torch.equal(getattr(result, field)[even], want.expand(len(even), *want.shape[1:])), field
    sub = type(result)(*(getattr(result, f)[odd] for f in
                         ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len")))
    assert_lossless(nodes, repeat_tree(nodes, len(odd)), row_logits, (1.2, -1, 1.0), sub, depth)


@lazy
def test_lazy_walk_temperature_zero_rows_equal_greedy_on_random_trees():
    trees, tree, logits = _case(12, batch=16, cols=10, vocab=9, depth=4)
    temperature = torch.where(torch.arange(16) % 4 == 0, 0.0, 0.8)  # mixed, so the lazy walk runs
    result = _lazy_verify(tree, logits, SamplingParams(temperature.to(FUSED_DEVICE)), 1, 4)
    greedy = verify_greedy(tree, logits, max_depth=4)
    rows = torch.arange(0, 16, 4)
    for field in ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len"):
        assert torch.equal(getattr(result, field)[rows], getattr(greedy, field)[rows]), field


@lazy
def test_lazy_walk_expectation_matches_torch_and_paths_are_consistent():
    trees, tree, logits = _case(13, batch=16, cols=10, vocab=9, depth=4)
    params = SamplingParams(0.9)
    result = _lazy_verify(tree, logits, params, 2, 4)
    want = verify_sampling(tree, logits, params, torch.Generator().manual_seed(0), max_depth=4, backend="torch")
    torch.testing.assert_close(result.expected_accept_len, want.expected_accept_len, rtol=1e-4, atol=1e-5)
    for b, nodes in enumerate(trees):
        path = result.accepted_nodes[b, : int(result.accept_len[b]) + 1].tolist()
        assert path[0] == 0 and all(nodes[c].parent == p for p, c in zip(path, path[1:]))
        assert (result.accepted_nodes[b, len(path):] == -1).all()
        assert 0 <= int(result.bonus_token[b]) < 9
        if len(path) - 1 < 4:  # ended early: the bonus is not a child token of the last node
            assert int(result.bonus_token[b]) not in {nodes[c].token for c in children_of(nodes)[path[-1]]}


@lazy
@pytest.mark.parametrize("max_depth", [0, 1, 2])
def test_lazy_walk_respects_max_depth(max_depth):
    # a chain whose tokens carry almost all the mass: the walk goes as deep as max_depth allows
    nodes = [Node(-1, -1, 0.0, 0), Node(0, 3, 0.0, 1), Node(1, 5, 0.0, 2), Node(2, 1, 0.0, 3)]
    row_logits = torch.zeros(4, 8)
    for node in nodes[1:]:
        row_logits[node.parent, node.token] = 40.0
    tree = repeat_tree(nodes, 8)
    logits = row_logits.expand(8, -1, -1).contiguous()
    result = _lazy_verify(tree, logits, SamplingParams(1.0), 3, max_depth)
    assert result.accepted_nodes.shape == (8, max_depth + 1)
    assert (result.accept_len == max_depth).all()
    assert (result.accepted_nodes == torch.arange(max_depth + 1)).all()
    assert (result.bonus_token == nodes[max_depth + 1].token).all()  # the pick at the last accepted node
    torch.testing.assert_close(result.expected_accept_len, torch.full((8,), float(max_depth)), rtol=1e-5, atol=1e-5)


@lazy
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_lazy_walk_rejects_non_finite_logits(bad):
    _, tree, logits = _case(8, batch=4)
    logits = logits.clone()
    logits[2, 1, 4] = bad
    with pytest.raises(ValueError, match="target_logits"):
        verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), SamplingParams(1.0), backend="triton")


@lazy
def test_lazy_walk_falls_back_when_only_the_scaled_logits_overflow():
    # finite bf16 logits near the fp32 limit: x / T overflows in fp32, so the lazy path hands over
    _, tree, logits = _case(8, batch=4)
    logits = logits.to(torch.bfloat16)
    logits[0, 0, 0] = 3.0e38
    result = verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), SamplingParams(0.5), backend="triton",
                             max_depth=4)
    want = verify_sampling(tree, logits.float(), SamplingParams(0.5), torch.Generator().manual_seed(0), max_depth=4,
                           backend="torch")
    assert bool(((result.bonus_token >= 0) & (result.bonus_token < logits.shape[-1])).all())
    torch.testing.assert_close(result.expected_accept_len.cpu(), want.expected_accept_len, rtol=1e-4, atol=1e-5)


@lazy
def test_scaled_row_lse_and_min_match_torch_with_split_rows():
    from ddtree.core.triton_verify import scaled_row_lse_and_min

    gen = torch.Generator(device=FUSED_DEVICE).manual_seed(3)
    logits = (torch.randn((2, 3, 700), generator=gen, device=FUSED_DEVICE) * 3).to(torch.bfloat16)
    inv_t = torch.tensor([1 / 0.3, 1.0], device=FUSED_DEVICE)
    for block in (16, 64, 1024):  # 16 and 64 split each row over several programs
        lse, low = scaled_row_lse_and_min(logits, inv_t, block=block)
        torch.testing.assert_close(lse, torch.logsumexp(logits.float() * inv_t.view(2, 1, 1), -1), rtol=1e-5,
                                   atol=1e-4)
        assert torch.equal(low, logits.float().amin(-1))
