"""Engine options of issue 14: verifier by name, temperature-aware trees, per-round target entropy."""

from __future__ import annotations

import pytest
import torch

from ddtree.engine.engine import DecodingEngine
from ddtree.engine.types import GenerationRequest
from ddtree.models.pair import load_pair


@pytest.fixture(scope="module")
def pair(untrained_pair):
    return load_pair(untrained_pair)


def _request(temperature: float, seed: int = 3, **kw) -> GenerationRequest:
    return GenerationRequest(input_ids=[5, 17, 42, 9, 100, 7], max_new_tokens=20, temperature=temperature, seed=seed, **kw)


def test_unknown_verifier_is_refused(pair):
    with pytest.raises(ValueError, match="verifier must be one of"):
        DecodingEngine(pair, method="ddtree", budget=8, verifier="nope")


def test_tree_sampling_keeps_greedy_output_and_the_sampled_law_machinery(pair):
    raw = DecodingEngine(pair, method="ddtree", budget=8)
    processed = DecodingEngine(pair, method="ddtree", budget=8, tree_sampling=True)
    ar = DecodingEngine(pair, method="ar")
    greedy = _request(0.0)
    assert raw.generate(greedy).output_ids == processed.generate(greedy).output_ids == ar.generate(greedy).output_ids
    out = processed.generate(_request(0.7, top_k=5, top_p=0.9))
    assert len(out.output_ids) == 20 and len(out.accept_lens) == out.rounds == len(out.expected_accept_lens)
    assert all(0.0 <= e <= 8 for e in out.expected_accept_lens)


def test_entropies_are_recorded_per_round(pair):
    engine = DecodingEngine(pair, method="ddtree", budget=8)
    greedy, sampled = engine.generate(_request(0.0)), engine.generate(_request(1.0))
    assert greedy.entropies == [0.0] * greedy.rounds
    assert len(sampled.entropies) == sampled.rounds and all(e > 0 for e in sampled.entropies)
    vocab = engine.vocab_size
    import math

    assert max(sampled.entropies) <= math.log(vocab) + 1e-4
    assert DecodingEngine(pair, method="ar").generate(_request(1.0)).entropies == []


def test_sampled_trees_are_built_at_the_tree_temperature(pair, monkeypatch):
    """The Hugging Face engine builds a sampled request's tree on its draft logits divided by 1 + T, a greedy
    request's on the raw ones, and every tree on the raw ones under DDTREE_RAW_SAMPLED_TREES."""
    from ddtree import switches
    from ddtree.engine import engine as engine_module

    seen = []
    real = engine_module.build_tree

    def spy(draft_logits, budget, **kw):
        seen.append(draft_logits.clone())
        return real(draft_logits, budget, **kw)

    monkeypatch.setattr(engine_module, "build_tree", spy)
    firsts = {}
    for policy, overrides in (("tempered", {}), ("raw", {"raw_sampled_trees": True})):
        with switches.override(**overrides):
            engine = DecodingEngine(pair, method="ddtree", budget=8)
        for temperature in (0.0, 0.5):
            seen.clear()
            engine.generate(_request(temperature))
            firsts[policy, temperature] = seen[0]  # the first round's: the same prefill, the same draft
    assert torch.equal(firsts["tempered", 0.0], firsts["raw", 0.0])
    torch.testing.assert_close(firsts["tempered", 0.5], firsts["raw", 0.5] / 1.5)
