"""Triton kernels of the tree builder: the fused vocabulary step and the one-program beam.

Runs on CUDA when present (the real kernels), else on CPU under the Triton interpreter when
TRITON_INTERPRET=1 is set (small V, few rows), else skips (CI has no triton).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from ddtree.core import build
from ddtree.core.build import _beam_torch, _candidate_pairs, _descending_key, _vocab_step, build_tree

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


@pytest.fixture(autouse=True)
def triton_lse_in_torch_step(monkeypatch) -> None:
    """The torch step on CUDA takes its logsumexp from `row_lse_and_min`; do the same under the interpreter."""
    if ON_CUDA:
        return
    from ddtree.core.triton_kernels import row_lse_and_min

    def lse_and_bad(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lse, row_min = row_lse_and_min(x2d)
        return lse, ~(torch.isfinite(lse) & (row_min > float("-inf"))).all()

    monkeypatch.setattr(build, "_row_logsumexp", lse_and_bad)


def distinct_logits(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every row a permutation of distinct values exact in bf16/fp16 (no ties: torch top-k is unambiguous)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(rows)])  # [R, V]
    return ((perm - vocab // 2).float() / 8).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("vocab, k", [(64, 64), (200, 1), (256, 37), (512, 64)])
def test_fused_step_equals_torch_step_without_ties(dtype: torch.dtype, vocab: int, k: int) -> None:
    x = distinct_logits(3, vocab, dtype, seed=vocab + k)
    got = _vocab_step(x, k, fused=True)
    ref = _vocab_step(x, k, fused=False)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(got[0].view(torch.int32), ref[0].view(torch.int32)), "bit-identical logq"


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("vocab, k, levels", [(64, 20, 1.0), (300, 40, 2.0), (512, 64, 0.5), (97, 97, 1.0)])
def test_fused_step_is_exact_with_ties(dtype: torch.dtype, vocab: int, k: int, levels: float) -> None:
    x = tied_logits(4, vocab, levels, dtype, seed=k)
    x[0, :7] = -0.0  # -0.0 ties with +0.0 (same value), smaller id first
    x[0, 7:9] = 0.0
    logq, ids, bad = _vocab_step(x, k, fused=True)
    _, _, torch_bad = _vocab_step(x, k, fused=False)
    lse = build._row_logsumexp(x)[0]  # [R] the torch step's lse
    ref_logq, ref_ids = exact_reference(x, k, lse)
    assert torch.equal(ids, ref_ids)
    assert torch.equal(logq, ref_logq)
    assert not bool(bad) and not bool(torch_bad)
    kth = x.float().gather(1, ref_ids[:, -1:])
    assert ((x.float() == kth).sum(1) > 1).any(), "the case really has ties at the k-th position"


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_fused_step_flags_non_finite(dtype: torch.dtype, bad_value: float) -> None:
    x = tied_logits(3, 128, 2.0, dtype, seed=1)
    assert not bool(_vocab_step(x, 16, fused=True)[2])
    x[1, 77] = bad_value
    assert bool(_vocab_step(x, 16, fused=True)[2])


def test_fused_lse_is_the_row_lse_kernel() -> None:
    from ddtree.core.triton_kernels import row_lse_and_min, row_topk_lse

    x = tied_logits(5, 300, 3.0, torch.bfloat16, seed=4)
    _, _, lse, row_min = row_topk_lse(x, 10)
    ref_lse, ref_min = row_lse_and_min(x)
    assert torch.equal(lse, ref_lse) and torch.equal(row_min, ref_min)
    torch.testing.assert_close(lse, torch.logsumexp(x.float(), -1), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("vocab, k", [(1000, 50), (777, 1), (1024, 256)])
def test_fused_topk_split_rows_with_ties(dtype: torch.dtype, vocab: int, k: int) -> None:
    # a small block splits each row over several programs: per-split offsets must line up exactly
    from ddtree.core.triton_kernels import _split_geometry, row_lse_and_min, row_topk_lse

    assert _split_geometry(3, vocab, 64)[0] > 1
    x = tied_logits(3, vocab, 1.5, dtype, seed=vocab)
    vals, ids, lse, row_min = row_topk_lse(x, k, block=64, compact_block=32)
    logq, ids = build._sorted_logq(vals, ids, lse)
    ref_lse, ref_min = row_lse_and_min(x, block=64)
    ref_logq, ref_ids = exact_reference(x, k, ref_lse)
    assert torch.equal(ids, ref_ids) and torch.equal(logq, ref_logq)
    assert torch.equal(lse, ref_lse) and torch.equal(row_min, ref_min)


@pytest.mark.parametrize("bad_k", [0, 301, 2.0])
def test_fused_step_rejects_bad_k(bad_k) -> None:
    from ddtree.core.triton_kernels import row_topk_lse

    with pytest.raises(ValueError, match="k must"):
        row_topk_lse(tied_logits(2, 300, 1.0, torch.bfloat16, seed=0), bad_k)
    with pytest.raises(ValueError, match="x must"):
        row_topk_lse(torch.zeros((2, 300), device=DEVICE), 4)


def assert_heap_equals_batched(dtype: torch.dtype, budget: int) -> None:
    """Both builders on tied and distinct [2, 4, 150] logits give identical trees."""
    for x in (tied_logits(2 * 4, 150, 1.0, dtype, seed=9), distinct_logits(2 * 4, 150, dtype, seed=9)):
        logits = x.view(2, 4, 150)
        heap = build_tree(logits, budget, method="heap")
        batched = build_tree(logits, budget, method="batched")
        for f in FIELDS:
            assert torch.equal(getattr(heap, f), getattr(batched, f)), f


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("budget", [5, 40])
def test_heap_equals_batched_on_the_fused_step(monkeypatch, dtype: torch.dtype, budget: int) -> None:
    # force the fused step on this device (CPU under the interpreter too): both builders then use it
    monkeypatch.setattr(build, "_fused_topk_usable", lambda x2d: x2d.dtype in FUSED_DTYPES)
    assert_heap_equals_batched(dtype, budget)


# ---------------------------------------------------------------- one read (lse + min + group maxima) + int32 keys


def with_signed_zeros(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Replace a third of x [R, V] by -0.0 / +0.0 (one value under the tie rule, two bit patterns)."""
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, 3, x.shape, generator=gen).to(x.device)  # [R, V]
    zeros = torch.where(pick == 0, -0.0, 0.0).to(x.dtype)
    return torch.where(pick < 2, zeros, x)


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize(
    "vocab, k, levels",
    # short last groups (300 = 4 * 64 + 44, 1000, 2000); k below, at and above the number of groups
    [(64, 64, 1.0), (300, 40, 1.0), (1000, 1, 0.5), (1000, 8, 2.0), (2000, 16, 0.5), (2000, 64, 1.0)],
)
def test_grouped_step_is_exact_with_ties(dtype: torch.dtype, vocab: int, k: int, levels: float) -> None:
    from ddtree.core.triton_kernels import row_lse_and_min, row_lse_min_groupmax

    for x in (tied_logits(5, vocab, levels, dtype, seed=vocab + k), distinct_logits(3, vocab, dtype, seed=k)):
        x = with_signed_zeros(x, seed=vocab) if levels == 1.0 else x
        logq, ids, bad = build._vocab_step_grouped(x, k)
        ref_lse, ref_min = row_lse_and_min(x)
        ref_logq, ref_ids = exact_reference(x, k, ref_lse)
        assert torch.equal(ids, ref_ids)
        assert torch.equal(logq, ref_logq)
        assert not bool(bad)
        lse, row_min, gmax = row_lse_min_groupmax(x)
        assert torch.equal(lse, ref_lse) and torch.equal(row_min, ref_min)  # same kernel, same splits
        groups = -(-vocab // build.GROUP)
        pad = torch.full((x.shape[0], groups * build.GROUP - vocab), float("-inf"), device=x.device)
        ref_gmax = torch.cat([x.float(), pad], 1).view(x.shape[0], groups, build.GROUP).amax(-1)  # [R, G]
        assert torch.equal(gmax, ref_gmax)


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_grouped_step_flags_non_finite(dtype: torch.dtype, bad_value: float) -> None:
    x = distinct_logits(4, 300, dtype, seed=1)
    x[2, 77] = bad_value
    _, _, bad = build._vocab_step_grouped(x, 16)
    assert bool(bad)


@pytest.mark.parametrize("dtype", FUSED_DTYPES)
@pytest.mark.parametrize("budget", [5, 40])
def test_heap_equals_batched_on_the_grouped_step(monkeypatch, dtype: torch.dtype, budget: int) -> None:
    # force the grouped step on this device (CPU under the interpreter too): both builders then use it; eager,
    # so that every call goes through Python (a replayed CUDA graph would not call the step)
    monkeypatch.setenv("DDTREE_NO_CUDA_GRAPH", "1")
    monkeypatch.setattr(build, "_fused_topk_usable", lambda x2d: False)
    monkeypatch.setattr(build, "_select_usable", lambda x2d, k: False)
    monkeypatch.setattr(build, "_grouped_usable", lambda x2d, k: x2d.dtype in FUSED_DTYPES)
    calls = []
    step = build._vocab_step_grouped
    monkeypatch.setattr(build, "_vocab_step_grouped", lambda x2d, k: calls.append(k) or step(x2d, k))
    assert_heap_equals_batched(dtype, budget)
    assert len(calls) >= 4  # both builders went through the grouped step


# ---------------------------------------------------------------- Triton select step (group maxima -> top-k)


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
    from ddtree.core.triton_kernels import grouped_vocab_topk, row_lse_and_min

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
    from ddtree.core.triton_kernels import grouped_vocab_topk

    x = distinct_logits(4, 300, dtype, seed=1)
    x[2, 77] = bad_value
    bad = grouped_vocab_topk(x, 16)[4]
    assert bad.tolist() == [0, 0, 1, 0]


def test_select_step_reads_the_logits_at_x_address() -> None:
    """With x_address the kernels read the buffer whose address it holds; x only gives the layout (this is
    how one captured CUDA graph serves a fresh logits buffer per call)."""
    from ddtree.core.triton_kernels import grouped_vocab_topk

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

    monkeypatch.setattr(build, "_fused_topk_usable", lambda x2d: False)
    monkeypatch.setattr(build, "_select_usable", lambda x2d, k: x2d.dtype in FUSED_DTYPES)
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
    from ddtree.core.triton_kernels import grouped_vocab_topk

    with pytest.raises(ValueError, match="cap must be"):
        grouped_vocab_topk(distinct_logits(2, 300, torch.bfloat16, seed=0), 40, cap=bad_cap)


@pytest.mark.parametrize("bad_k", [0, 257, 301])
def test_select_step_rejects_bad_k(bad_k: int) -> None:
    from ddtree.core.triton_kernels import grouped_vocab_topk

    with pytest.raises(ValueError, match="k must be"):
        grouped_vocab_topk(distinct_logits(2, 300, torch.bfloat16, seed=0), bad_k)


@pytest.mark.parametrize("budget", [5, 40])
def test_heap_equals_batched_on_the_select_step(monkeypatch, budget: int) -> None:
    # force the select step on this device (CPU under the interpreter too): both builders then use it, eager
    monkeypatch.setenv("DDTREE_NO_CUDA_GRAPH", "1")
    monkeypatch.setattr(build, "_fused_topk_usable", lambda x2d: False)
    monkeypatch.setattr(build, "_select_usable", lambda x2d, k: x2d.dtype in FUSED_DTYPES)
    calls = []
    step = build._vocab_step_select
    monkeypatch.setattr(build, "_vocab_step_select", lambda x2d, k: calls.append(k) or step(x2d, k))
    assert_heap_equals_batched(torch.bfloat16, budget)
    assert len(calls) >= 4  # both builders went through the select step


# ---------------------------------------------------------------- one-program beam


def beam_inputs(b: int, d: int, k: int, ties: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted per-depth top-k like depth_topk gives: logq [B, D, k] descending, ids [B, D, k]."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((b * d, 4 * k), generator=gen) * 2
    if ties:
        x = x.round()
    logq, ids, _ = _vocab_step(x, k, fused=False)
    return logq.view(b, d, k).to(DEVICE), ids.view(b, d, k).to(DEVICE)


@pytest.mark.parametrize("width", [8, 64, 128, 256])
@pytest.mark.parametrize("ties", [False, True])
def test_triton_beam_equals_torch_beam(width: int, ties: bool) -> None:
    from ddtree.core.triton_kernels import beam_search

    d = 3 if not ON_CUDA else 15
    logq, ids = beam_inputs(2, d, width, ties, seed=width)
    js, rs, pair_low = _candidate_pairs(width, width, DEVICE)
    got = beam_search(logq, ids, js, rs, width)
    ref = _beam_torch(logq, ids, js, rs, pair_low, width)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


@pytest.mark.parametrize("width, budget", [(8, 8), (64, 64), (128, 128), (16, 40)])
@pytest.mark.parametrize("ties", [False, True])
def test_triton_tree_from_beam_equals_torch(width: int, budget: int, ties: bool) -> None:
    from ddtree.core.triton_kernels import tree_from_beam

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
    from ddtree.core.triton_kernels import tree_from_beam

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
def test_fused_step_is_enabled_on_cuda(monkeypatch, dtype: torch.dtype) -> None:
    monkeypatch.setenv("DDTREE_FUSED_TOPK", "1")  # opt-in (slower than the pruned torch step on an H200)
    assert build._fused_topk_usable(torch.zeros((2, 8), dtype=dtype, device="cuda")), "probe failed: see warnings"
    assert not build._fused_topk_usable(torch.zeros((2, 8), device="cuda")), "float32 keeps the torch step"


@cuda_only
@pytest.mark.parametrize("dtype", FUSED_DTYPES)
def test_grouped_step_is_enabled_on_cuda(dtype: torch.dtype) -> None:
    assert build._grouped_usable(torch.zeros((2, 8), dtype=dtype, device="cuda"), 8), "probe failed: see warnings"
    assert not build._grouped_usable(torch.zeros((2, 8), device="cuda"), 8), "float32 keeps the torch step"


@cuda_only
@pytest.mark.parametrize("dtype", FUSED_DTYPES)
def test_select_step_is_enabled_on_cuda(dtype: torch.dtype) -> None:
    assert build._select_usable(torch.zeros((2, 8), dtype=dtype, device="cuda"), 8), "probe failed: see warnings"
    assert not build._select_usable(torch.zeros((2, 8), device="cuda"), 8), "float32 keeps the torch step"
    assert not build._select_usable(torch.zeros((2, 4096), dtype=dtype, device="cuda"), 300), "k > 256"


@cuda_only
@pytest.mark.parametrize("budget", [32, 128, 256])
def test_triton_beam_is_used_on_cuda(budget: int) -> None:
    if budget > build._triton_beam_max_width():
        pytest.skip(f"DDTREE_TRITON_BEAM_MAX_WIDTH={build._triton_beam_max_width()}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn((2, 15, 4096), generator=gen, device="cuda") * 3).to(torch.bfloat16)
    logq, ids, _ = build.depth_topk(logits, budget)
    js, rs, low = _candidate_pairs(budget, budget, DEVICE)
    got = build._triton_tail_checked(logq, ids, js, rs, low, budget, budget)
    assert got is not None, "Triton beam failed or disagreed with the torch beam: see warnings"
