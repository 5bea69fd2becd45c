"""DecodingEngine on the tiny pairs (CPU, float32): greedy identity, cache compaction, stops, errors."""

from __future__ import annotations

import json

import pytest
import torch

import ddtree.engine.engine as engine_module
from ddtree.engine import DecodingEngine, GenerationRequest
from ddtree.engine.kv import cache_keyword, new_cache
from ddtree.models.pair import load_pair


@pytest.fixture(scope="module")
def tiny_engine(tiny_pair):
    return DecodingEngine(load_pair(tiny_pair), method="ddtree", budget=16)


@pytest.fixture(scope="module")
def untrained_engine(untrained_pair):
    return DecodingEngine(load_pair(untrained_pair), method="ddtree", budget=8)


@pytest.fixture(scope="module")
def prompts(tiny_pair, tiny_engine):
    lines = (tiny_pair / "prompts" / "heldout.jsonl").read_text().splitlines()[:3]
    tok = tiny_engine.tokenizer
    return [tok.encode(json.loads(line)["text"])[-48:] for line in lines]


def _req(ids, **kw):
    return GenerationRequest(input_ids=list(ids), **kw)


@pytest.mark.parametrize("method,budgets", [("dflash", [None]), ("ddtree", [1, 4, 16, 64])])
def test_greedy_outputs_equal_ar(tiny_engine, prompts, method, budgets):
    accepted = 0
    for ids in prompts:
        ref = tiny_engine.generate(_req(ids, max_new_tokens=32), method="ar")
        assert len(ref.output_ids) == 32 and ref.finish_reason == "length"
        for budget in budgets:
            out = tiny_engine.generate(_req(ids, max_new_tokens=32), method=method, budget=budget)
            assert out.output_ids == ref.output_ids, (method, budget)
            assert out.finish_reason == "length"
            assert len(out.accept_lens) == out.rounds == len(out.expected_accept_lens)
            # greedy: the expected acceptance of a round is its realised acceptance
            assert out.expected_accept_lens == pytest.approx([float(a) for a in out.accept_lens])
            assert sum(out.accept_lens) + out.rounds >= 31  # every round emits accept + 1 tokens
            assert set(out.stage_times) == {"draft", "tree_build", "tree_compile", "verify", "commit"}
            accepted += sum(out.accept_lens)
    assert accepted > 0  # the trained drafter gets drafts accepted: the tree paths are exercised


def test_max_new_tokens_truncates_every_method(tiny_engine, prompts):
    ids = prompts[0]
    ref = tiny_engine.generate(_req(ids, max_new_tokens=13), method="ar").output_ids
    for n in (1, 2, 5, 13):
        for method in ("ar", "dflash", "ddtree"):
            out = tiny_engine.generate(_req(ids, max_new_tokens=n), method=method)
            assert out.output_ids == ref[:n] and out.finish_reason == "length", (method, n)


def test_cache_after_each_round_equals_fresh_prefill(tiny_engine, prompts, monkeypatch):
    snapshots = []
    real_keep_rows = engine_module.keep_rows

    def recording_keep_rows(cache, committed, rows, num_rows):
        real_keep_rows(cache, committed, rows, num_rows)
        snapshots.append([(layer.keys.clone(), layer.values.clone()) for layer in cache.layers])

    monkeypatch.setattr(engine_module, "keep_rows", recording_keep_rows)
    ids = prompts[1]
    out = tiny_engine.generate(_req(ids, max_new_tokens=24), method="ddtree", budget=16)
    assert len(snapshots) == out.rounds
    sequence = list(ids) + out.output_ids
    target = tiny_engine.target
    checked = 0
    for snap in snapshots:
        length = snap[0][0].shape[2]
        if length > len(sequence):  # last round cut by max_new_tokens: its tail is not in the output
            continue
        fresh = new_cache(target, length + 1)
        tokens = torch.tensor([sequence[:length]])
        with torch.inference_mode():
            target(input_ids=tokens, position_ids=torch.arange(length)[None], use_cache=True,
                   **{cache_keyword(target): fresh})
        for (keys, values), layer in zip(snap, fresh.layers):
            assert torch.allclose(keys, layer.keys, atol=1e-4)
            assert torch.allclose(values, layer.values, atol=1e-4)
        checked += 1
    assert checked >= out.rounds - 1 and checked >= 2


def test_seeded_sampling_is_reproducible(tiny_engine, prompts):
    req = _req(prompts[0], max_new_tokens=16, temperature=1.0, top_p=0.9, seed=1234)
    a = tiny_engine.generate(req, method="ddtree")
    b = tiny_engine.generate(req, method="ddtree")
    assert a.output_ids == b.output_ids and len(a.output_ids) == 16
    # E[accepted drafts] of a round is a sum of path probabilities over at most D levels
    assert all(0.0 <= e <= tiny_engine.block_size - 1 + 1e-4 for e in a.expected_accept_lens)


def test_stop_token_is_excluded(tiny_engine, prompts):
    ids = prompts[2]
    ref = tiny_engine.generate(_req(ids, max_new_tokens=24), method="ar").output_ids
    stop = ref[6]
    cut = ref.index(stop)
    for method in ("ar", "dflash", "ddtree"):
        out = tiny_engine.generate(_req(ids, max_new_tokens=24, stop_token_ids=[stop]), method=method)
        assert out.output_ids == ref[:cut], method
        assert out.finish_reason == "stop" and out.matched_stop == stop


def test_stop_string_cuts_at_completing_token(tiny_engine, prompts):
    ids = prompts[0]
    tok = tiny_engine.tokenizer
    ref = tiny_engine.generate(_req(ids, max_new_tokens=24), method="ar").output_ids
    text = tok.decode(ref, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop
    end = next(i for i in range(1, len(ref) + 1) if stop in tok.decode(ref[:i], skip_special_tokens=True))
    for method in ("ar", "dflash", "ddtree"):
        out = tiny_engine.generate(_req(ids, max_new_tokens=24, stop_strings=[stop]), method=method)
        assert out.output_ids == ref[:end], method
        assert out.finish_reason == "stop" and out.matched_stop == stop


@pytest.mark.parametrize(
    "kwargs,call,match",
    [
        ({"max_new_tokens": 0}, {}, "max_new_tokens"),
        ({"max_new_tokens": 2000}, {}, "context"),
        ({"temperature": -1.0}, {}, "temperature"),
        ({"top_p": 0.0}, {}, "top_p"),
        ({"top_p": 1.5}, {}, "top_p"),
        ({"top_k": 2.5}, {}, "top_k"),
        ({}, {"method": "beam"}, "method"),
        ({}, {"budget": 0}, "budget"),
    ],
)
def test_bad_requests_raise(untrained_engine, kwargs, call, match):
    with pytest.raises(ValueError, match=match):
        untrained_engine.generate(_req([1, 2, 3], **kwargs), **call)


def test_prompt_longer_than_context_raises(untrained_engine):
    too_long = [1] * untrained_engine.max_context
    with pytest.raises(ValueError, match="prompt"):
        untrained_engine.generate(_req(too_long, max_new_tokens=1))
    with pytest.raises(ValueError, match="input_ids"):
        untrained_engine.generate(_req([]))
    with pytest.raises(ValueError, match="input_ids"):
        untrained_engine.generate(_req([10**9]))


def test_constructor_rejects_bad_arguments(untrained_pair):
    pair = load_pair(untrained_pair)
    with pytest.raises(ValueError, match="method"):
        DecodingEngine(pair, method="eagle")
    with pytest.raises(ValueError, match="budget"):
        DecodingEngine(pair, budget=0)
    with pytest.raises(ValueError, match="dtype"):
        DecodingEngine(pair, dtype="float8")


def test_max_context_and_output_record(untrained_engine):
    assert untrained_engine.max_context == untrained_engine.target.config.max_position_embeddings
    out = untrained_engine.generate(_req([5, 6, 7], max_new_tokens=4), method="ddtree", budget=3)
    assert out.method == "ddtree" and out.budget == 3
    assert out.ttft > 0 and out.decode_time >= 0 and out.tau >= 1.0
