"""Temperature sampling through the tree is lossless: the emitted tokens follow the target's law.

The exact law of the first L = 3 emitted tokens under the request's processing (temperature, top-k,
top-p) is computed from plain target forwards (no cache, no tree). Cells form a fixed partition of
token sequences built from that law alone: a sequence of probability >= MIN_EXPECTED / RUNS is a cell;
the sequences under a kept prefix that are in no finer cell form that prefix's rest cell. Each
method's sample of RUNS seeded generations is compared with the law by a chi-square goodness-of-fit
test at significance level ALPHA = 1e-3 (per test).

Tokens 2-3 come from the first verify round(s), so the tree walk, the bonus
draw and the commit of accepted nodes are on the tested path. The tiny pair's target is nearly flat
at T = 1 over its vocabulary, so the variants use a lower temperature or top-k / top-p to put most
of the mass on cells that resolve tokens 2 and 3.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from ddtree.core.sampling import SamplingParams, process_logits
from ddtree.engine import DecodingEngine, GenerationRequest
from ddtree.models.pair import load_pair

ALPHA = 1e-3
RUNS = 400  # seeded generations per method and variant
LENGTH = 3  # emitted tokens compared
MIN_EXPECTED = 5.0  # expected count of a cell of its own
REST = None  # marks a rest cell: (prefix..., REST)


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return DecodingEngine(load_pair(tiny_pair), method="ddtree", budget=16)


@pytest.fixture(scope="module")
def prompt(tiny_pair, engine):
    line = (tiny_pair / "prompts" / "heldout.jsonl").read_text().splitlines()[0]
    return engine.tokenizer.encode(json.loads(line)["text"])[-32:]


def prefix_cells(target, prompt: list[int], params: SamplingParams, length: int, min_prob: float) -> dict:
    """{cell: exact probability}; cells are kept full sequences and (kept prefix..., REST)."""
    cells: dict[tuple, float] = {}
    seqs: list[tuple[int, ...]] = [()]
    probs = torch.ones(1, dtype=torch.float64)  # [S]
    for _ in range(length):
        ids = torch.tensor([prompt + list(s) for s in seqs], dtype=torch.long)  # [S, P + level]
        with torch.inference_mode():
            logits = target(input_ids=ids).logits[:, -1].float()  # [S, V]
        joint = probs[:, None] * process_logits(logits, params).double()  # [S, V]
        rows, toks = torch.nonzero(joint >= min_prob, as_tuple=True)
        kept = joint[rows, toks]
        for i, s in enumerate(seqs):
            cells[s + (REST,)] = float(probs[i] - kept[rows == i].sum())
        seqs = [seqs[r] + (t,) for r, t in zip(rows.tolist(), toks.tolist())]
        probs = kept
        if not seqs:
            break
    cells.update(zip(seqs, probs.tolist()))
    return cells


def cell_of(seq: tuple[int, ...], cells: dict) -> tuple:
    if seq in cells:
        return seq
    for cut in range(len(seq) - 1, -1, -1):
        if seq[:cut] + (REST,) in cells:
            return seq[:cut] + (REST,)
    raise KeyError(seq)  # unreachable: () + (REST,) is always a cell


def goodness_of_fit(sample: Counter, cells: dict) -> float:
    """Chi-square p-value of the sampled sequences against the exact cell probabilities."""
    counts = Counter(cell_of(seq, cells) for seq in sample.elements())
    runs = sum(counts.values())
    keys = sorted(cells, key=repr)
    observed = [counts.get(k, 0) for k in keys]
    expected = [runs * max(cells[k], 0.0) for k in keys]
    if any(o > 0 and e < 1e-9 for o, e in zip(observed, expected)):
        return 0.0  # a sequence the law forbids was emitted
    pairs = [(o, e) for o, e in zip(observed, expected) if e >= 1e-9]
    if len(pairs) < 2:
        return 1.0
    obs, exp = zip(*pairs)
    scale = sum(obs) / sum(exp)  # 1 up to float rounding of the law
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def _sample(engine, prompt, method, budget, seed0, sampling):
    counts: Counter = Counter()
    accepted = 0
    for i in range(RUNS):
        req = GenerationRequest(input_ids=prompt, max_new_tokens=LENGTH, seed=seed0 + i, **sampling)
        out = engine.generate(req, method=method, budget=budget)
        assert len(out.output_ids) == LENGTH
        counts[tuple(out.output_ids)] += 1
        accepted += sum(out.accept_lens)
    return counts, accepted


@pytest.mark.parametrize(
    "method,budget,sampling",
    [
        ("ddtree", 16, {"temperature": 0.3}),
        ("ddtree", 8, {"temperature": 1.0, "top_k": 4}),
        ("ddtree", 16, {"temperature": 0.7, "top_p": 0.5}),
        ("dflash", None, {"temperature": 0.5, "top_k": 8}),
        ("ar", None, {"temperature": 0.3}),
    ],
)
def test_emitted_law_equals_target_law(engine, prompt, method, budget, sampling):
    cells = prefix_cells(engine.target, prompt, SamplingParams(**sampling), LENGTH, MIN_EXPECTED / RUNS)
    counts, accepted = _sample(engine, prompt, method, budget, 1000, sampling)
    if method != "ar":
        assert accepted > 0  # drafts were accepted: the tree walk was exercised
    p = goodness_of_fit(counts, cells)
    assert p > ALPHA, f"{method} {sampling}: p = {p:.2e} over {len(cells)} cells"


def test_goodness_of_fit_detects_a_wrong_law():
    cells = {(1, REST): 0.0, (REST,): 0.2, (1,): 0.5, (2,): 0.3}
    right = Counter({(1,): 200, (2,): 120, (3,): 80})
    wrong = Counter({(1,): 240, (2,): 120, (3,): 40})
    assert goodness_of_fit(right, cells) > ALPHA
    assert goodness_of_fit(wrong, cells) < ALPHA
    assert goodness_of_fit(Counter({(1,): 400}), {(1,): 1.0, (REST,): 0.0}) == 1.0
    assert goodness_of_fit(Counter({(1,): 399, (9,): 1}), {(1,): 1.0, (REST,): 0.0}) == 0.0


def test_prefix_cells_partition_the_law(engine, prompt):
    cells = prefix_cells(engine.target, prompt, SamplingParams(temperature=0.5, top_k=8), LENGTH, 0.01)
    assert sum(cells.values()) == pytest.approx(1.0, abs=1e-9)
    # remainder cells are 1 - (sum of float32 child probabilities): rounding can leave them at -1e-8
    assert min(cells.values()) > -1e-6
    assert any(len(k) == LENGTH and REST not in k for k in cells)


@pytest.fixture(scope="module")
def batched(tiny_pair):
    from ddtree.engine.batched import BatchedEngine

    return BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=16, max_batch=8)


def _sample_batched(engine, prompt, method, budget, seed0, sampling):
    requests = [GenerationRequest(input_ids=prompt, max_new_tokens=LENGTH, seed=seed0 + i, **sampling)
                for i in range(RUNS)]
    outputs = engine.generate_batch(requests, method=method, budget=budget)  # 8 rows at a time, refilled
    assert all(len(o.output_ids) == LENGTH for o in outputs)
    return Counter(tuple(o.output_ids) for o in outputs), sum(sum(o.accept_lens) for o in outputs)


@pytest.mark.parametrize(
    "method,budget,sampling",
    [
        ("ddtree", 16, {"temperature": 0.7, "top_p": 0.5}),
        ("ddtree", 8, {"temperature": 1.0, "top_k": 4}),
        ("dflash", None, {"temperature": 0.5, "top_k": 8}),
    ],
)
def test_batched_engine_emitted_law_equals_target_law(batched, engine, prompt, method, budget, sampling):
    """The same goodness-of-fit test (alpha = 1e-3) through the batched engine: 400 seeded requests decoded
    8 at a time with counter-based coins."""
    cells = prefix_cells(engine.target, prompt, SamplingParams(**sampling), LENGTH, MIN_EXPECTED / RUNS)
    counts, accepted = _sample_batched(batched, prompt, method, budget, 5000, sampling)
    assert accepted > 0
    p = goodness_of_fit(counts, cells)
    assert p > ALPHA, f"batched {method} {sampling}: p = {p:.2e} over {len(cells)} cells"


def test_batched_law_test_rejects_a_wrong_temperature(batched, engine, prompt):
    """Power check: samples drawn at T = 0.4 tested against the T = 1 law (top-k 4 both) are rejected at
    alpha = 1e-3: the test sees a sampler that is wrong by a plausible amount."""
    cells = prefix_cells(engine.target, prompt, SamplingParams(temperature=1.0, top_k=4), LENGTH, MIN_EXPECTED / RUNS)
    counts, _ = _sample_batched(batched, prompt, "ddtree", 8, 9000, {"temperature": 0.4, "top_k": 4})
    assert goodness_of_fit(counts, cells) < ALPHA
