"""Tree builder: heap == batched, structural invariants, optimality against brute force, validation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree import switches
from ddtree.core.build import build_tree, build_tree_capturable, choose_method, depth_topk, prepare_build
from ddtree.core.types import DDTreeBuildResult
from ddtree.testing.nosync import NoHostSync

FIELDS = ("token_ids", "parents", "depths", "node_logws", "num_nodes")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def logits_and_budget(draw) -> tuple[torch.Tensor, int]:
    b = draw(st.integers(1, 3))
    d = draw(st.integers(1, 5))
    v = draw(st.integers(1, 12))
    budget = draw(st.integers(1, 40))  # often more than the number of prefixes when v, d are small
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    ties = draw(st.booleans())
    gen = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: exact ties inside a depth and (often) across depths
        x = torch.randint(-2, 2, (b, d, v), generator=gen).float()
    else:
        x = torch.randn((b, d, v), generator=gen) * draw(st.sampled_from([0.5, 2.0, 8.0]))
    return x.to(dtype), budget


def num_prefixes(d: int, v: int) -> int:
    return sum(v**i for i in range(1, d + 1))


def assert_same_tree(a: DDTreeBuildResult, b: DDTreeBuildResult) -> None:
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        assert x.shape == y.shape and x.dtype == y.dtype, field
        assert torch.equal(x, y), f"{field} differs:\n{x}\n{y}"


def assert_invariants(tree: DDTreeBuildResult, logits: torch.Tensor, budget: int) -> None:
    b, d, v = logits.shape
    n = budget + 1
    assert tree.token_ids.shape == (b, n) and tree.token_ids.dtype == torch.int64
    assert tree.parents.shape == (b, n) and tree.parents.dtype == torch.int64
    assert tree.depths.shape == (b, n) and tree.depths.dtype == torch.int64
    assert tree.node_logws.shape == (b, n) and tree.node_logws.dtype == torch.float32
    assert tree.num_nodes.shape == (b,) and tree.num_nodes.dtype == torch.int64
    logq = torch.log_softmax(logits.double(), dim=-1)  # [B, D, V] float64 reference
    expected_nodes = min(budget, num_prefixes(d, v)) + 1
    for row in range(b):
        m = int(tree.num_nodes[row])
        assert m == expected_nodes
        tok, par, dep = tree.token_ids[row].tolist(), tree.parents[row].tolist(), tree.depths[row].tolist()
        lw = tree.node_logws[row].double().tolist()
        assert (tok[0], par[0], dep[0], lw[0]) == (-1, -1, 0, 0.0)
        for i in range(m, n):  # padding
            assert (tok[i], par[i], dep[i], lw[i]) == (-1, -1, 0, -math.inf)
        children: dict[int, set[int]] = {}
        for i in range(1, m):
            p = par[i]
            assert 0 <= p < i, "parent must precede child"
            assert dep[i] == dep[p] + 1 and 1 <= dep[i] <= d
            assert 0 <= tok[i] < v
            assert tok[i] not in children.setdefault(p, set()), "children of a node carry distinct tokens"
            children[p].add(tok[i])
            edge = float(logq[row, dep[i] - 1, tok[i]])
            assert lw[i] == pytest.approx(lw[p] + edge, abs=1e-4 * (1 + abs(lw[i])))
            assert lw[i] <= lw[i - 1], "logw non-increasing in index"
            if lw[i] == lw[i - 1]:
                assert dep[i] >= dep[i - 1], "ties go to the smaller depth first"


@HYP
@given(case=logits_and_budget())
def test_batched_equals_heap(case) -> None:
    logits, budget = case
    heap = build_tree(logits, budget, method="heap")
    batched = build_tree(logits, budget, method="batched")
    assert_same_tree(heap, batched)
    assert_invariants(heap, logits, budget)


@HYP
@given(case=logits_and_budget())
def test_same_token_paths_and_auto(case, tree_tools) -> None:
    logits, budget = case
    heap = build_tree(logits, budget, method="heap")
    batched = build_tree(logits, budget, method="batched")
    assert tree_tools.token_paths(heap) == tree_tools.token_paths(batched)
    torch.testing.assert_close(heap.node_logws, batched.node_logws, rtol=0, atol=1e-6)
    assert_same_tree(heap, build_tree(logits, budget, method="auto"))


def brute_force_best(logits: torch.Tensor, budget: int) -> list[list[float]]:
    """Per request, the `budget` largest prefix logws over every prefix (float64, exhaustive)."""
    b, d, v = logits.shape
    logq = torch.log_softmax(logits.double(), dim=-1).tolist()
    out = []
    for row in range(b):
        scores = []
        for depth in range(1, d + 1):
            for path in itertools.product(range(v), repeat=depth):
                scores.append(sum(logq[row][i][t] for i, t in enumerate(path)))
        out.append(sorted(scores, reverse=True)[:budget])
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2), st.integers(1, 4), st.integers(1, 5), st.integers(1, 30), st.integers(0, 2**31 - 1)
)
def test_tree_is_the_best_budget_prefixes(b: int, d: int, v: int, budget: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((b, d, v), generator=gen) * 2
    for method in ("heap", "batched"):
        tree = build_tree(logits, budget, method=method)
        best = brute_force_best(logits, budget)
        for row in range(b):
            got = tree.node_logws[row, 1 : int(tree.num_nodes[row])].double().tolist()
            assert got == pytest.approx(best[row], abs=1e-4)


def test_realistic_shape_heap_equals_batched() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn((3, 15, 3000), generator=gen) * 3).to(torch.bfloat16)
    for budget in (1, 17, 128):
        heap = build_tree(logits, budget, method="heap")
        assert_same_tree(heap, build_tree(logits, budget, method="batched"))
        assert_invariants(heap, logits, budget)


def test_uniform_logits_follow_the_tie_rule() -> None:
    # all logws of one depth tie: depth 1 first, then token order inside a depth, parents in node order
    logits = torch.zeros((1, 2, 3))
    for method in ("heap", "batched"):
        tree = build_tree(logits, 5, method=method)
        assert tree.token_ids[0].tolist() == [-1, 0, 1, 2, 0, 1]
        assert tree.parents[0].tolist() == [-1, 0, 0, 0, 1, 1]
        assert tree.depths[0].tolist() == [0, 1, 1, 1, 2, 2]


def test_budget_larger_than_prefixes_pads() -> None:
    logits = torch.randn((2, 2, 2))
    for method in ("heap", "batched"):
        tree = build_tree(logits, 10, method=method)
        assert tree.num_nodes.tolist() == [7, 7]  # 2 + 4 prefixes + root
        assert (tree.token_ids[:, 7:] == -1).all() and torch.isinf(tree.node_logws[:, 7:]).all()
        assert tree.valid_mask().sum().item() == 14


def test_depth_topk_is_sorted_log_softmax() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 3, (2, 3, 50), generator=gen).to(torch.bfloat16)
    logq, ids, bad = depth_topk(logits, 20)
    assert not bool(bad)
    ref = torch.log_softmax(logits.float(), -1)
    torch.testing.assert_close(logq, ref.gather(-1, ids), rtol=0, atol=1e-5)
    assert (logq[..., 1:] <= logq[..., :-1]).all()
    ties = logq[..., 1:] == logq[..., :-1]
    assert (ids[..., 1:] > ids[..., :-1])[ties].all(), "equal logits: smaller token id first"


@pytest.mark.parametrize("dtype", DTYPES)
def test_output_device_and_dtypes(dtype: torch.dtype) -> None:
    tree = build_tree(torch.randn((2, 3, 7)).to(dtype), 4)
    assert tree.device == torch.device("cpu")
    assert [getattr(tree, f).dtype for f in FIELDS] == [torch.int64] * 3 + [torch.float32, torch.int64]


@pytest.mark.parametrize(
    "logits, budget, method, name",
    [
        (torch.randn(3, 4), 4, "heap", "draft_logits"),  # rank 2
        (torch.randn(1, 3, 4, 5), 4, "heap", "draft_logits"),  # rank 4
        (torch.randn(1, 0, 4), 4, "batched", "draft_logits"),  # D == 0
        (torch.randn(1, 3, 0), 4, "batched", "draft_logits"),  # V == 0
        (torch.randint(0, 3, (1, 3, 4)), 4, "heap", "draft_logits"),  # not floating
        ([[[0.0]]], 4, "heap", "draft_logits"),  # not a tensor
        (torch.randn(1, 3, 4), 0, "heap", "budget"),
        (torch.randn(1, 3, 4), -2, "batched", "budget"),
        (torch.randn(1, 3, 4), 2.0, "heap", "budget"),
        (torch.randn(1, 3, 4), True, "heap", "budget"),
        (torch.randn(1, 3, 4), torch.tensor(3), "heap", "budget"),
        (torch.randn(1, 3, 4), 4, "beam", "method"),
        (torch.randn(1, 3, 4), 4, None, "method"),
    ],
)
def test_bad_inputs_raise(logits, budget, method, name) -> None:
    with pytest.raises(ValueError, match=name):
        build_tree(logits, budget, method=method)


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("method", ["heap", "batched", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_logits_raise(bad_value: float, method: str, dtype: torch.dtype) -> None:
    logits = torch.randn(2, 3, 5)
    logits[1, 2, 3] = bad_value
    with pytest.raises(ValueError, match="draft_logits"):
        build_tree(logits.to(dtype), 4, method=method)


def test_choose_method_rule() -> None:
    for device in ("cpu", "cuda"):
        for b in (1, 8, 64):
            for budget in (1, 32, 256):
                assert choose_method(b, 15, 151936, budget, device) in ("heap", "batched")
    assert choose_method(64, 15, 151936, 256, "cpu") == "heap"
    assert choose_method(1, 15, 151936, 8, "cuda") == "batched"
    assert choose_method(1, 15, 151936, 256, "cuda") == "batched"


# ---------------------------------------------------------------- capture-safe entry points


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("budget", [1, 16, 60])
def test_build_tree_capturable_equals_build_tree_and_reads_nothing_on_the_host(dtype: torch.dtype, budget: int) -> None:
    gen = torch.Generator().manual_seed(budget)
    logits = (torch.randn((3, 5, 200), generator=gen) * 3).to(dtype)  # [B, D, V]
    logits[1] = logits[1].round()  # ties
    prepare_build("cpu", dtype, 3, 5, 200, budget)
    with NoHostSync():
        tree, bad = build_tree_capturable(logits, budget)
    assert bad.dim() == 0 and bad.dtype == torch.bool and not bool(bad)
    assert_same_tree(build_tree(logits, budget), tree)
    logits[2, 1, 7] = float("nan")
    with NoHostSync():
        _, bad = build_tree_capturable(logits, budget)
    assert bool(bad)


def test_no_host_sync_guard_catches_host_reads() -> None:
    x = torch.randn(4)
    for read in (lambda: bool(x.sum() > 0), lambda: x[x > 0], lambda: int(x.argmax()), lambda: torch.equal(x, x)):
        with pytest.raises(AssertionError, match="host"), NoHostSync():
            read()


# ---------------------------------------------------------------- CUDA (skipped without a GPU)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cpu_tree(tree: DDTreeBuildResult) -> DDTreeBuildResult:
    return DDTreeBuildResult(*(getattr(tree, f).cpu() for f in FIELDS))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("budget", [32, 128, 256])
def test_cuda_heap_equals_batched_graph_eager_and_auto(dtype: torch.dtype, budget: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(budget)
    logits = torch.randn((3, 15, 20000), generator=gen, device="cuda") * 3  # [B, D, V]
    logits[1] = logits[1].round()  # many exact ties inside each row, also at the k-th position
    logits = logits.to(dtype)
    heap = build_tree(logits, budget, method="heap")
    assert heap.device.type == "cuda"
    for method in ("batched", "auto"):
        assert_same_tree(heap, build_tree(logits, budget, method=method))
    with switches.override(no_cuda_graph=True):
        assert_same_tree(heap, build_tree(logits, budget, method="batched"))
    assert_invariants(_cpu_tree(heap), logits.cpu(), budget)


@CUDA
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("method", ["heap", "batched"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_non_finite_logits_raise(bad_value: float, method: str, dtype: torch.dtype) -> None:
    logits = torch.randn(2, 3, 4000, device="cuda")
    logits[1, 2, 3001] = bad_value
    with pytest.raises(ValueError, match="draft_logits"):
        build_tree(logits.to(dtype), 16, method=method)


@CUDA
def test_cuda_indirect_graph_reads_each_fresh_buffer_in_place() -> None:
    """bf16 logits, budget <= 256: one whole-build graph per shape reads each call's buffer through its address
    (fresh buffers, a non-contiguous view, ties); float32 logits build eagerly (the torch vocabulary step)."""
    from ddtree.core import build

    build.clear_graph_cache()
    gen = torch.Generator(device="cuda").manual_seed(1)
    for round_ in range(4):
        logits = (torch.randn((2, 15, 20000), generator=gen, device="cuda") * 3).to(torch.bfloat16)  # new buffer
        if round_ % 2:
            logits[1] = logits[1].round()  # ties
        assert_same_tree(build_tree(logits, 64, method="heap"), build_tree(logits, 64, method="batched"))
    wide = (torch.randn((2, 15, 40000), generator=gen, device="cuda") * 3).to(torch.bfloat16)
    view = wide[:, :, ::2]  # [2, 15, 20000], not contiguous
    assert_same_tree(build_tree(view, 64, method="heap"), build_tree(view, 64, method="batched"))
    assert len(build._GRAPHS) == 1, "expected one graph for the shape"
    float_logits = torch.randn((2, 15, 20000), generator=gen, device="cuda")  # float32: eager
    assert_same_tree(build_tree(float_logits, 64, method="heap"), build_tree(float_logits, 64, method="batched"))
    assert len(build._GRAPHS) == 1
    build.clear_graph_cache()


def test_indirect_dispatch_caches_one_graph_per_shape_and_falls_back_when_capture_fails(monkeypatch) -> None:
    """The indirect graph's bookkeeping, on CPU with a stand-in for the CUDA graph (the graph itself runs only
    on CUDA: test_cuda_indirect_graph_reads_each_fresh_buffer_in_place)."""
    from ddtree.core import build

    made = []

    class FakeGraph:
        def __init__(self, like, budget):
            made.append(budget)
            self.budget = budget

        def __call__(self, logits):
            assert logits.is_contiguous()
            return build._batched_tensors(logits, self.budget)

    monkeypatch.setattr(build, "_GraphedBuild", FakeGraph)
    monkeypatch.setattr(build, "_graph_applies", lambda logits, budget: True)
    build.clear_graph_cache()
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # fresh logits each round (one of them a non-contiguous view), one graph per shape
        logits = (torch.randn((2, 4, 600), generator=gen) * 3)[:, :, ::2]
        assert_same_tree(build_tree(logits, 16, method="heap"), build._build_batched(logits, 16))
    assert made == [16] and len(build._GRAPHS) == 1

    refused = []

    def refuse(like, budget):
        refused.append(budget)
        raise RuntimeError("capture refused")

    monkeypatch.setattr(build, "_GraphedBuild", refuse)
    logits = torch.randn((2, 4, 300), generator=gen) * 3
    with pytest.warns(UserWarning, match="capture of the batched build failed"):
        tree = build._build_batched(logits, 8)  # a new shape key: capture refused -> the eager build
    assert_same_tree(build_tree(logits, 8, method="heap"), tree)
    assert_same_tree(tree, build._build_batched(logits, 8))  # remembered: no second capture attempt
    assert refused == [8]
    build.clear_graph_cache()


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_capturable_build_verify_commit_in_one_callers_graph(dtype: torch.dtype) -> None:
    """The capture-safe calls inside ONE CUDA graph of the caller (a whole round: build, greedy verify, commit),
    replayed on new logits copied into its static inputs: equal to the checked eager calls."""
    from ddtree.core.verify import commit, prepare_verify, verify_greedy

    b, d, v, budget = 2, 15, 20000, 64
    prepare_build("cuda", dtype, b, d, v, budget)
    prepare_verify("cuda")
    draft = torch.zeros((b, d, v), device="cuda", dtype=dtype)
    target = torch.zeros((b, budget + 1, v), device="cuda", dtype=dtype)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree, bad = build_tree_capturable(draft, budget)
        result = verify_greedy(tree, target, max_depth=d, validate=False)
        done = commit(tree, result)
    gen = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(3):
        draft.copy_((torch.randn(draft.shape, generator=gen, device="cuda") * 3).to(dtype))
        target.copy_((torch.randn(target.shape, generator=gen, device="cuda") * 3).to(dtype))
        graph.replay()
        want = build_tree(draft, budget, method="heap")
        assert not bool(bad)
        assert_same_tree(want, tree)
        want_done = commit(want, verify_greedy(want, target, max_depth=d))
        assert torch.equal(done.emitted_tokens, want_done.emitted_tokens)
        assert torch.equal(done.num_kept, want_done.num_kept)


def test_flagged_build_is_the_build_and_flags_non_finite_logits():
    from ddtree.core.build import build_tree_flagged

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn((3, 4, 50), generator=gen) * 3
    tree, bad = build_tree_flagged(logits, 12)
    want = build_tree(logits, 12)
    assert not bool(bad)
    for name in ("token_ids", "parents", "depths", "node_logws", "num_nodes"):
        assert torch.equal(getattr(tree, name), getattr(want, name)), name
    logits[1, 2, 7] = float("nan")
    tree, bad = build_tree_flagged(logits, 12)  # reported, not raised
    assert bool(bad) and tree.token_ids.shape == (3, 13)
