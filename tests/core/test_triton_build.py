"""Triton kernels of the tree builder (core/triton_build.py): the select step, the one-program beam and the tree
assembly.

Runs on CUDA when present (the real kernels), else on CPU under the Triton interpreter when
TRITON_INTERPRET=1 is set (small V, few rows), else skips (CI has no triton).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from ddtree.core import build
from ddtree.core.build import (
    BuildPaths,
    _beam_torch,
    _candidate_pairs,
    _descending_key,
    _vocab_step_torch,
    build_tree,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
ON_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")

pytestmark = pytest.mark.skipif(
    not HAS_TRITON or not (ON_CUDA or INTERPRET), reason="needs triton and CUDA, or TRITON_INTERPRET=1"
)
FUSED_DTYPES = (torch.bfloat16, torch.float16)
FIELDS = ("token_ids", "parents", "depths", "node_logws", "num_nodes")


def exact_reference(x: torch.Tensor, k: int, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of x [R, V] under the tie rule from a full key over the row: (logq [R, k], ids [R, k])."""
    slot = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
    ids = _descending_key(x.float(), slot).topk(k, dim=-1).indices  # [R, k], all keys distinct
    return x.float().gather(1, ids) - lse.unsqueeze(1), ids


def tied_logits(rows: int, vocab: int, levels: float, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Logits rounded to a few distinct values: long runs of exact ties, some across the k-th position."""
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn((rows, vocab), generator=gen) * levels).round() / 2).to(dtype).to(DEVICE)


def distinct_logits(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every row a permutation of distinct values exact in bf16/fp16 (no ties: torch top-k is unambiguous)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(rows)])  # [R, V]
    return ((perm - vocab // 2).float() / 8).to(dtype).to(DEVICE)


def assert_heap_equals_batched(dtype: torch.dtype, budget: int) -> None:
    """Both builders on tied and distinct [2, 4, 150] logits give identical trees."""
    for x in (tied_logits(2 * 4, 150, 1.0, dtype, seed=9), distinct_logits(2 * 4, 150, dtype, seed=9)):
        logits = x.view(2, 4, 150)
        heap = build_tree(logits, budget, method="heap")
        batched = build_tree(logits, budget, method="batched")
        for f in FIELDS:
            assert torch.equal(getattr(heap, f), getattr(batched, f)), f


# ---------------------------------------------------------------- Triton select step (group maxima -> top-k)


def force_select_step(monkeypatch) -> None:
    """The select step for bf16/fp16 on this device (CPU under the interpreter too), eager (every call goes
    through Python), the torch tail on CPU."""
    forced = BuildPaths(select=True, triton_tail=ON_CUDA, graph=False, beam_max_width=256)
    monkeypatch.setattr(build, "build_paths", lambda device: forced)


def with_signed_zeros(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Replace a third of x [R, V] by -0.0 / +0.0 (one value under the tie rule, two bit patterns)."""
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, 3, x.shape, generator=gen).to(x.device)  # [R, V]
    zeros = torch.where(pick == 0, -0.0, 0.0).to(x.dtype)
    return torch.where(pick < 2, zeros, x)


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize(
    "vocab, k, chunk, levels",
    [
        (64, 64, None, 1.0),  # one group: every id is a candidate
        (300, 40, None, 1.0),  # short last group, fewer groups (5) than k
        (1000, 1, None, 0.5),
        (2000, 16, 4, 0.5),  # long tie runs: many groups reach the threshold, several chunks
        (5003, 16, None, 2.0),
        (5003, 64, 8, 1.0),
        (5003, 256, None, 0.5),
    ],
)
@pytest.mark.parametrize("cap", ["smallest", None, "large"])
def test_select_step_is_exact_with_ties(
    dtype: torch.dtype, vocab: int, k: int, chunk, levels: float, cap: str | None
) -> None:
    """cap "smallest" (= padded k) sends most rows to the counting path (more candidates >= T1 than k_pad),
    "large" (4096) sorts even the tied rows' candidates directly; the default mixes both."""
    from ddtree.core.triton_build import grouped_vocab_topk, row_lse_and_min

    k_pad = max(16, 1 << (k - 1).bit_length())
    cap = {"smallest": k_pad, "large": 4096, None: None}[cap]
    for x in (tied_logits(4, vocab, levels, dtype, seed=vocab + k), distinct_logits(2, vocab, dtype, seed=k)):
        x = with_signed_zeros(x, seed=vocab) if levels == 1.0 else x
        logq, ids, lse, row_min, bad = grouped_vocab_topk(x, k, group=build.GROUP, chunk=chunk, cap=cap)
        ref_lse, ref_min = row_lse_and_min(x)
        _, ref_ids = exact_reference(x, k, ref_lse)
        assert torch.equal(ids, ref_ids)
        assert torch.equal(logq, x.float().gather(1, ref_ids) - lse.unsqueeze(1))
        assert torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)  # merged in the kernel: last bit may differ
        assert torch.equal(row_min, ref_min)
        assert not bad.any()


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_select_step_flags_non_finite_rows(dtype: torch.dtype, bad_value: float) -> None:
    from ddtree.core.triton_build import grouped_vocab_topk

    x = distinct_logits(4, 300, dtype, seed=1)
    x[2, 77] = bad_value
    bad = grouped_vocab_topk(x, 16)[4]
    assert bad.tolist() == [0, 0, 1, 0]


def test_select_step_reads_the_logits_at_x_address() -> None:
    """With x_address the kernels read the buffer whose address it holds; x only gives the layout (this is
    how one captured CUDA graph serves a fresh logits buffer per call)."""
    from ddtree.core.triton_build import grouped_vocab_topk

    layout = distinct_logits(3, 1000, torch.bfloat16, seed=0)
    other = tied_logits(3, 1000, 1.0, torch.bfloat16, seed=1)
    address = torch.tensor([other.data_ptr()], dtype=torch.int64, device=DEVICE)
    got = grouped_vocab_topk(layout, 40, x_address=address)
    want = grouped_vocab_topk(other, 40)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="x_address"):
        grouped_vocab_topk(layout.t().contiguous().t(), 40, x_address=address)


@pytest.mark.parametrize("budget", [5, 40])
def test_indirect_build_body_equals_the_heap_for_each_buffer(monkeypatch, budget: int) -> None:
    """The body the indirect CUDA graph replays (`_batched_tensors` with an address), run eagerly: captured once
    for one buffer's layout, it builds each later buffer's tree once the address is set to that buffer."""
    from ddtree.core.build import _batched_tensors

    force_select_step(monkeypatch)
    layout = distinct_logits(2 * 4, 150, torch.bfloat16, seed=3).view(2, 4, 150)
    address = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    for seed in range(3):
        rows = tied_logits(8, 150, 1.0, torch.bfloat16, seed=seed) if seed % 2 else distinct_logits(
            8, 150, torch.bfloat16, seed=seed)
        fresh = rows.view(2, 4, 150)  # another buffer each round, ties in every other one
        address.fill_(fresh.data_ptr())
        tree = build._result(_batched_tensors(layout, budget, address))
        heap = build_tree(fresh, budget, method="heap")
        for f in FIELDS:
            assert torch.equal(getattr(heap, f), getattr(tree, f)), f


@pytest.mark.parametrize("bad_cap", [8, 48, 100])
def test_select_step_rejects_bad_cap(bad_cap: int) -> None:
    from ddtree.core.triton_build import grouped_vocab_topk

    with pytest.raises(ValueError, match="cap must be"):
        grouped_vocab_topk(distinct_logits(2, 300, torch.bfloat16, seed=0), 40, cap=bad_cap)


@pytest.mark.parametrize("bad_k", [0, 257, 301])
def test_select_step_rejects_bad_k(bad_k: int) -> None:
    from ddtree.core.triton_build import grouped_vocab_topk

    with pytest.raises(ValueError, match="k must be"):
        grouped_vocab_topk(distinct_logits(2, 300, torch.bfloat16, seed=0), bad_k)


@pytest.mark.parametrize("budget", [5, 40])
def test_heap_equals_batched_on_the_select_step(monkeypatch, budget: int) -> None:
    # force the select step on this device (CPU under the interpreter too): both builders then use it, eager
    force_select_step(monkeypatch)
    calls = []
    step = build._vocab_step_select
    monkeypatch.setattr(build, "_vocab_step_select", lambda x2d, k, x_address=None: calls.append(k) or step(x2d, k))
    assert_heap_equals_batched(torch.bfloat16, budget)
    assert len(calls) >= 4  # both builders went through the select step


# ---------------------------------------------------------------- one-program beam


def beam_inputs(b: int, d: int, k: int, ties: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted per-depth top-k like depth_topk gives: logq [B, D, k] descending, ids [B, D, k]."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((b * d, 4 * k), generator=gen) * 2
    if ties:
        x = x.round()
    logq, ids, _ = _vocab_step_torch(x, k)
    return logq.view(b, d, k).to(DEVICE), ids.view(b, d, k).to(DEVICE)


@pytest.mark.parametrize("width", [8, 64, 128, 256])
@pytest.mark.parametrize("ties", [False, True])
def test_triton_beam_equals_torch_beam(width: int, ties: bool) -> None:
    from ddtree.core.triton_build import beam_search

    d = 3 if not ON_CUDA else 15
    logq, ids = beam_inputs(2, d, width, ties, seed=width)
    js, rs, pair_low = _candidate_pairs(width, width, DEVICE)
    got = beam_search(logq, ids, js, rs, width)
    ref = _beam_torch(logq, ids, js, rs, pair_low, width)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def _pruned_depths(logq: torch.Tensor, beam_logw: torch.Tensor, js: torch.Tensor, rs: torch.Tensor,
                   width: int, cap: int) -> int:
    """How many (request, depth) steps the tau cut leaves at most `cap` candidates (the compacted branch)."""
    b, d, _ = logq.shape
    hits = 0
    for i in range(b):
        for depth in range(1, d):
            tau = beam_logw[i, depth - 1, width - 1] + logq[i, depth, 0]
            cand = beam_logw[i, depth - 1, js] + logq[i, depth, rs]
            hits += int((cand >= tau).sum()) <= cap
    return hits


@pytest.mark.parametrize("width, prune", [(8, 16), (32, 64), (64, 128), (128, 256)])
@pytest.mark.parametrize("scale", [2.0, 12.0])
@pytest.mark.parametrize("ties", [False, True])
def test_the_tau_cut_keeps_the_beam_exact(width: int, prune: int, scale: float, ties: bool) -> None:
    """The beam with the tau cut (sorting only the candidates scoring at least logw[W-1] + logq[0] when they fit
    the cut's size) equals the torch beam, ties and -inf padding included; both branches are exercised."""
    from ddtree.core.triton_build import beam_search

    d = 4 if not ON_CUDA else 15
    gen = torch.Generator().manual_seed(width * 7 + prune)
    x = torch.randn((2 * d, 4 * width), generator=gen) * scale
    if ties:
        x = x.round()
    logq, ids, _ = _vocab_step_torch(x, width)
    logq, ids = logq.view(2, d, width).to(DEVICE), ids.view(2, d, width).to(DEVICE)
    js, rs, pair_low = _candidate_pairs(width, width, DEVICE)
    ref = _beam_torch(logq, ids, js, rs, pair_low, width)
    got = beam_search(logq, ids, js, rs, width, prune=prune)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    if not ties and not ON_CUDA:  # these inputs (D = 4) take both branches: some depths fit the cut, others sort every candidate
        fits = _pruned_depths(logq.cpu(), ref[0].cpu(), js.cpu(), rs.cpu(), width, max(prune, 2 * width))
        assert 0 < fits < 2 * (d - 1)


@pytest.mark.parametrize("width, budget", [(1, 1), (1, 3), (2, 1), (8, 8), (64, 64), (128, 128), (16, 40)])
@pytest.mark.parametrize("ties", [False, True])
def test_triton_tree_from_beam_equals_torch(width: int, budget: int, ties: bool) -> None:
    from ddtree.core.triton_build import tree_from_beam

    d = 3 if not ON_CUDA else 15
    logq, ids = beam_inputs(2, d, width, ties, seed=width + budget)
    js, rs, pair_low = _candidate_pairs(width, width, DEVICE)
    beam = _beam_torch(logq, ids, js, rs, pair_low, width)
    got = tree_from_beam(*beam, budget)
    ref = build._tree_from_beam_torch(*beam, budget)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def test_triton_tree_from_beam_pads_a_short_tree() -> None:
    """Fewer real prefixes than the budget (-inf beam padding): the same padding as the torch tail."""
    from ddtree.core.triton_build import tree_from_beam

    logq, ids = beam_inputs(2, 2, 4, False, seed=3)  # D = 2, k = 4: at most 4 + 16 prefixes
    logq[1, 1, 2:] = float("-inf")  # request 1: only 2 tokens at depth 2
    width = 32
    js, rs, pair_low = _candidate_pairs(width, 4, DEVICE)
    beam = _beam_torch(logq, ids, js, rs, pair_low, width)
    got = tree_from_beam(*beam, width)
    ref = build._tree_from_beam_torch(*beam, width)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert got[4].tolist() == [1 + 4 + 16, 1 + 4 + 8]


# ---------------------------------------------------------------- the real GPU paths are switched on

cuda_only = pytest.mark.skipif(not ON_CUDA, reason="the probes only run on CUDA")


@cuda_only
@pytest.mark.parametrize("dtype", FUSED_DTYPES)
def test_select_step_is_enabled_on_cuda(dtype: torch.dtype) -> None:
    assert build._select_applies(torch.zeros((2, 8), dtype=dtype, device="cuda"), 8), "probe failed: see warnings"
    assert not build._select_applies(torch.zeros((2, 8), device="cuda"), 8), "float32 keeps the torch step"
    assert not build._select_applies(torch.zeros((2, 4096), dtype=dtype, device="cuda"), 300), "k > 256"


@cuda_only
@pytest.mark.parametrize("budget", [32, 128, 256])
def test_triton_beam_is_used_on_cuda(budget: int) -> None:
    if budget > build.build_paths("cuda").beam_max_width:
        pytest.skip(f"DDTREE_TRITON_BEAM_MAX_WIDTH={build.build_paths('cuda').beam_max_width}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn((2, 15, 4096), generator=gen, device="cuda") * 3).to(torch.bfloat16)
    logq, ids, _ = build.depth_topk(logits, budget)
    js, rs, low = _candidate_pairs(budget, budget, DEVICE)
    got = build._triton_tail(logq, ids, js, rs, low, budget, budget)
    assert got is not None, "Triton beam failed or disagreed with the torch beam: see warnings"
