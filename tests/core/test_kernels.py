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

from ddtree.core.kernels import (
    KERNEL_ARG_ORDER,
    draw_coins,
    kernel_outputs_to_verify_result,
    load_sglang_kernel,
    prepare_kernel_args,
    reference_tree_speculative_sampling_target_only,
    verify_with_kernel,
)
from ddtree.core.retrieve import encode_retrieve
from ddtree.core.sampling import SamplingParams, process_logits
from ddtree.core.verify import verify_greedy, verify_sampling

try:
    from tests.core.test_verify import ROWS, _random_case, assert_lossless
    from tests.core.trees import Node, batch_trees, children_of, naive_encode_retrieve, random_tree, repeat_tree
except ImportError:
    from test_verify import ROWS, _random_case, assert_lossless
    from trees import Node, batch_trees, children_of, naive_encode_retrieve, random_tree, repeat_tree


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


# ---------------------------------------------------------------- fused Triton sampler
# Runs on CUDA with triton, or on CPU with triton under TRITON_INTERPRET=1 (slow: about 25 s per
# 20,000-row lossless case). Lossless statistics as in test_verify: chi-square and z-test at alpha 1e-3.

FUSED_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _fused_usable() -> bool:
    from ddtree.core.kernels import triton_sampler_usable

    return triton_sampler_usable(FUSED_DEVICE)


fused = pytest.mark.skipif(not _fused_usable(), reason="fused Triton sampler not usable here (no triton / CUDA)")


def _to(tree, device):
    return type(tree)(*(getattr(tree, f).to(device) for f in
                        ("token_ids", "parents", "depths", "node_logws", "num_nodes")))


@fused
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_fused_sampler_is_lossless(monkeypatch, temperature):
    """The inverse-CDF row sampler (the lazy walk, preferred when usable, is switched off here)."""
    import ddtree.core.kernels as kernels

    monkeypatch.setattr(kernels, "lazy_walk_usable", lambda device: False)
    nodes, row_logits = _random_case(seed=11)
    tree = repeat_tree(nodes, ROWS)
    logits = row_logits.expand(ROWS, -1, -1).contiguous()
    gen = torch.Generator(device=FUSED_DEVICE).manual_seed(5)
    result = verify_sampling(_to(tree, FUSED_DEVICE), logits.to(FUSED_DEVICE), SamplingParams(temperature), gen,
                             max_depth=4, backend="triton")
    result = type(result)(*(getattr(result, f).cpu() for f in
                            ("accept_len", "accepted_nodes", "bonus_token", "expected_accept_len")))
    assert_lossless(nodes, tree, row_logits, (temperature, -1, 1.0), result, 4)


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
def test_fused_sampler_compiles_on_cuda_when_triton_imports():
    from ddtree.core.kernels import TRITON_PROBE_ERRORS, triton_sampler_importable, triton_sampler_usable

    if not triton_sampler_importable():
        pytest.skip("triton not importable")
    assert triton_sampler_usable(FUSED_DEVICE), TRITON_PROBE_ERRORS.get(str(FUSED_DEVICE))


def test_triton_backend_unusable_raises_on_plain_cpu():
    if _fused_usable():
        pytest.skip("the fused sampler is usable here")
    _, tree, logits = _case(9, batch=2)
    with pytest.raises(ValueError, match="backend='triton'"):
        verify_sampling(tree, logits, SamplingParams(1.0), backend="triton")


# Inverse-CDF sampler (the preferred fused path): the lossless tests above run through it; these cover
# the Gumbel fallback, the lse against torch and the non-finite contract.


@fused
@pytest.mark.parametrize("temperature", [0.7])
def test_gumbel_fallback_is_lossless(monkeypatch, temperature):
    import ddtree.core.kernels as kernels

    monkeypatch.setattr(kernels, "cdf_sampler_usable", lambda device: False)
    test_fused_sampler_is_lossless(monkeypatch, temperature)


@fused
def test_cdf_sampler_lse_and_greedy_rows_match_torch():
    from ddtree.core.kernels import cdf_sample_rows

    gen = torch.Generator(device=FUSED_DEVICE).manual_seed(3)
    logits = (torch.randn((4, 3, 5000), generator=gen, device=FUSED_DEVICE) * 3).to(torch.bfloat16)
    inv_t = torch.tensor([1.0, 1 / 0.3, 1.0, 1 / 1.7], device=FUSED_DEVICE)
    noisy = torch.tensor([False, True, True, True], device=FUSED_DEVICE)
    tokens, lse = cdf_sample_rows(logits, inv_t, noisy, gen)
    want = torch.logsumexp(logits.float() * inv_t.view(4, 1, 1), dim=-1)  # [4, 3]
    torch.testing.assert_close(lse, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(tokens[0], logits[0].float().argmax(-1))
    assert bool(((tokens >= 0) & (tokens < 5000)).all())


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


def _lazy_usable() -> bool:
    from ddtree.core.kernels import lazy_walk_usable

    return lazy_walk_usable(FUSED_DEVICE)


lazy = pytest.mark.skipif(not _lazy_usable(), reason="lazy Triton walk not usable here (no triton / CUDA)")
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
    from ddtree.core.kernels import scaled_row_lse_and_min

    gen = torch.Generator(device=FUSED_DEVICE).manual_seed(3)
    logits = (torch.randn((2, 3, 700), generator=gen, device=FUSED_DEVICE) * 3).to(torch.bfloat16)
    inv_t = torch.tensor([1 / 0.3, 1.0], device=FUSED_DEVICE)
    for block in (16, 64, 1024):  # 16 and 64 split each row over several programs
        lse, low = scaled_row_lse_and_min(logits, inv_t, block=block)
        torch.testing.assert_close(lse, torch.logsumexp(logits.float() * inv_t.view(2, 1, 1), -1), rtol=1e-5,
                                   atol=1e-4)
        assert torch.equal(low, logits.float().amin(-1))
