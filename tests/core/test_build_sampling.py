"""Temperature-aware tree build: build_tree(..., sampling=) is the build on the processed log-probabilities.

Property-based over shapes, temperatures, top-k, top-p, per-row (batched) parameters with greedy rows,
for both methods (heap, batched) on CPU, and on CUDA when present.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.core.build import build_tree
from ddtree.core.build_sampling import MIN_LOG_PROB, impossible_floor, processed_draft_logprobs, tree_logit_scale
from ddtree.core.sampling import SamplingParams, process_logits

FIELDS = ("token_ids", "parents", "depths", "node_logws", "num_nodes")
HYP = settings(max_examples=50, deadline=None)
TEMPS = (0.0, 0.3, 0.7, 1.0, 1.6)


def same_tree(a, b, *, logw_tol: float = 0.0) -> None:
    """Equal trees; `logw_tol` > 0 compares the log-weights to that tolerance (across devices, where the
    build's own log-softmax rounds differently in the last bit) and everything else exactly."""
    for field in FIELDS:
        x, y = getattr(a, field).cpu(), getattr(b, field).cpu()
        if field == "node_logws" and logw_tol > 0:
            torch.testing.assert_close(x, y, rtol=logw_tol, atol=logw_tol, msg=f"{field} differs:\n{x}\n{y}")
        else:
            assert x.shape == y.shape and torch.equal(x, y), f"{field} differs:\n{x}\n{y}"


@st.composite
def cases(draw):
    b = draw(st.integers(1, 3))
    d = draw(st.integers(1, 4))
    v = draw(st.integers(2, 9))
    budget = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.5, 2.0, 6.0]))
    logits = torch.randn((b, d, v), generator=torch.Generator().manual_seed(seed)) * scale
    per_row = draw(st.booleans())
    if per_row:
        temps = draw(st.lists(st.sampled_from(TEMPS), min_size=b, max_size=b))
        ks = draw(st.lists(st.sampled_from([-1, 1, 2, 3, v]), min_size=b, max_size=b))
        ps = draw(st.lists(st.sampled_from([1.0, 0.9, 0.5, 0.2]), min_size=b, max_size=b))
        params = SamplingParams(temperature=torch.tensor(temps), top_k=torch.tensor(ks), top_p=torch.tensor(ps))
    else:
        params = SamplingParams(temperature=draw(st.sampled_from(TEMPS[1:])),
                                top_k=draw(st.sampled_from([-1, 1, 2, 3])),
                                top_p=draw(st.sampled_from([1.0, 0.9, 0.5])))
    return logits, budget, params


def _row_params(params: SamplingParams, row: int) -> SamplingParams:
    def pick(x):
        return x[row : row + 1] if isinstance(x, torch.Tensor) else x

    return SamplingParams(temperature=pick(params.temperature), top_k=pick(params.top_k), top_p=pick(params.top_p))


@HYP
@given(case=cases())
def test_sampling_build_is_the_build_on_processed_logprobs(case) -> None:
    logits, budget, params = case
    # all rows greedy: build_tree keeps the raw logits (the raw tree), so compare with the raw build
    processed = logits if params.all_greedy else processed_draft_logprobs(logits, params)
    for method in ("heap", "batched"):
        same_tree(build_tree(logits, budget, method=method, sampling=params),
                  build_tree(processed, budget, method=method))
    same_tree(build_tree(logits, budget, method="heap", sampling=params),
              build_tree(logits, budget, method="batched", sampling=params))


@HYP
@given(case=cases())
def test_batched_rows_equal_each_request_built_alone(case) -> None:
    logits, budget, params = case
    for method in ("heap", "batched"):
        whole = build_tree(logits, budget, method=method, sampling=params)
        for row in range(logits.shape[0]):
            alone = build_tree(logits[row : row + 1], budget, method=method, sampling=_row_params(params, row))
            for field in FIELDS[:3] + FIELDS[4:]:
                assert torch.equal(getattr(whole, field)[row], getattr(alone, field)[0]), (method, row, field)
            # a greedy row alone is built on its raw logits, inside a mixed batch on their log-softmax:
            # the same tree, logws equal to rounding
            torch.testing.assert_close(whole.node_logws[row], alone.node_logws[0], rtol=0, atol=1e-5)


def _prefix_scores(lp: torch.Tensor, possible: torch.Tensor, row: int) -> list[tuple[bool, float]]:
    """Every prefix of request `row`: (all tokens possible, sum of log-probs in float64)."""
    _, d, v = lp.shape
    out = []
    for depth in range(1, d + 1):
        for path in itertools.product(range(v), repeat=depth):
            ok = all(bool(possible[row, i, t]) for i, t in enumerate(path))
            out.append((ok, sum(float(lp[row, i, t]) for i, t in enumerate(path))))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 5), st.integers(1, 25), st.integers(0, 2**31 - 1),
       st.sampled_from(TEMPS[1:]), st.sampled_from([-1, 1, 2]), st.sampled_from([1.0, 0.8, 0.4]))
def test_tree_is_the_best_prefixes_of_the_processed_marginals(d, v, budget, seed, t, k, p) -> None:
    """Independent of the floor's value: possible nodes first, and they are the best `budget` possible
    prefixes under log(process_logits(draft)); the raw tree's prefixes would not be, in general."""
    logits = torch.randn((1, d, v), generator=torch.Generator().manual_seed(seed)) * 2
    params = SamplingParams(temperature=t, top_k=k, top_p=p)
    probs = process_logits(logits, params).double()  # [1, D, V]
    possible = probs > 0
    scores = _prefix_scores(probs.clamp_min(1e-300).log(), possible, 0)
    best_possible = sorted((s for ok, s in scores if ok), reverse=True)
    for method in ("heap", "batched"):
        tree = build_tree(logits, budget, method=method, sampling=params)
        m = int(tree.num_nodes[0])
        logws = tree.node_logws[0, 1:m].double().tolist()
        n_ok = min(budget, len(best_possible))
        assert logws[:n_ok] == pytest.approx(best_possible[:n_ok], abs=1e-4)
        assert all(w >= d * MIN_LOG_PROB for w in logws[:n_ok])
        assert all(w < d * MIN_LOG_PROB for w in logws[n_ok:]), "impossible nodes only after every possible one"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(2, 30), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_greedy_keeps_the_raw_tree_and_plain_t1_keeps_its_paths(b, d, v, budget, seed) -> None:
    logits = torch.randn((b, d, v), generator=torch.Generator().manual_seed(seed)) * 3
    for method in ("heap", "batched"):
        raw = build_tree(logits, budget, method=method)
        same_tree(raw, build_tree(logits, budget, method=method, sampling=SamplingParams(temperature=0.0)))
        mixed = SamplingParams(temperature=torch.tensor([0.0] * b))
        same_tree(raw, build_tree(logits, budget, method=method, sampling=mixed))
        t1 = build_tree(logits, budget, method=method, sampling=SamplingParams(temperature=1.0))
        torch.testing.assert_close(t1.node_logws, raw.node_logws, rtol=0, atol=1e-4)


def test_top_k_one_puts_the_argmax_chain_first_and_floors_the_rest() -> None:
    logits = torch.tensor([[[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]]])  # [1, D=2, V=3]
    tree = build_tree(logits, 4, method="heap", sampling=SamplingParams(temperature=0.7, top_k=1))
    assert tree.token_ids[0, 1:3].tolist() == [0, 1] and tree.parents[0, 1:3].tolist() == [0, 1]
    assert float(tree.node_logws[0, 2]) == 0.0  # log 1 + log 1
    assert float(tree.node_logws[0, 3]) < impossible_floor(2)  # the next node is impossible


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_cuda_matches_cpu(case) -> None:
    """CUDA's log-softmax rounds differently from the CPU's in the last bit (in the processing and again in
    the build's own normalisation), so on the same processed log-probabilities the devices build the same
    tree, with log-weights equal to float32 rounding; on one device the two routes agree exactly."""
    logits, budget, params = case
    def on(device, x):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    cuda_params = SamplingParams(temperature=on("cuda", params.temperature), top_k=on("cuda", params.top_k),
                                 top_p=on("cuda", params.top_p))
    cuda_logprobs = processed_draft_logprobs(logits.cuda(), cuda_params)
    torch.testing.assert_close(cuda_logprobs.cpu(), processed_draft_logprobs(logits, params), rtol=1e-5, atol=1e-5)
    for method in ("heap", "batched"):
        gpu = build_tree(logits.cuda(), budget, method=method, sampling=cuda_params)
        same_tree(gpu, build_tree(cuda_logprobs, budget, method=method))
        same_tree(gpu, build_tree(cuda_logprobs.cpu(), budget, method=method), logw_tol=1e-5)


def test_tree_logit_scale_is_one_over_one_plus_t():
    """Greedy rows keep their logits (factor exactly 1); sampled rows' are divided by 1 + T; floats and tensors."""
    t = torch.tensor([0.0, 0.5, 1.0, 2.0])
    assert torch.equal(tree_logit_scale(t), torch.tensor([1.0, 1 / 1.5, 0.5, 1 / 3]))
    assert tree_logit_scale(0.0) == 1.0 and tree_logit_scale(1.0) == 0.5
    logits = torch.randn(2, 3, 7)
    assert torch.equal(logits * tree_logit_scale(0.0), logits)  # the greedy tree is bit for bit the raw one
