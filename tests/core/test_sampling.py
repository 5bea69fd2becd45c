"""SamplingParams validation and process_logits against a plain per-row NumPy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ddtree.core.sampling import SamplingParams, process_logits


def naive_process_row(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Temperature, then top-k, then top-p, written out plainly in float64."""
    vocab = logits.shape[0]
    if temperature == 0:
        out = np.zeros(vocab)
        out[int(np.argmax(logits))] = 1.0
        return out
    x = logits.astype(np.float64) / temperature
    if 0 < top_k < vocab:
        kth = np.sort(x)[::-1][top_k - 1]
        x = np.where(x < kth, -np.inf, x)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if top_p < 1:
        mass = 0.0
        for token in np.argsort(-probs, kind="stable"):
            mass += probs[token]
            smallest_kept = probs[token]
            if mass >= top_p:
                break
        probs = np.where(probs < smallest_kept, 0.0, probs)
        probs /= probs.sum()
    return probs


def naive_process(logits: torch.Tensor, temperature: list, top_k: list, top_p: list) -> np.ndarray:
    rows = logits.double().numpy()
    out = np.zeros_like(rows)
    for b in range(rows.shape[0]):
        for idx in np.ndindex(*rows.shape[1:-1]):
            out[(b, *idx)] = naive_process_row(rows[(b, *idx)], temperature[b], top_k[b], top_p[b])
    return out


@pytest.mark.parametrize("shape", [(6, 10), (6, 5, 10)])
def test_process_logits_matches_naive_per_row(shape):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(shape, generator=gen) * 2.0
    temperature = [0.0, 0.5, 1.0, 1.7, 1.0, 0.8]
    top_k = [-1, 3, 0, 1, 20, 4]
    top_p = [1.0, 1.0, 0.7, 1.0, 0.5, 0.9]
    params = SamplingParams(torch.tensor(temperature), torch.tensor(top_k), torch.tensor(top_p))
    before = logits.clone()
    probs = process_logits(logits, params)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    assert torch.equal(logits, before), "process_logits must not modify its input"
    np.testing.assert_allclose(probs.double().numpy(), naive_process(logits, temperature, top_k, top_p), atol=2e-6)


def test_scalar_params_broadcast_to_every_row():
    logits = torch.randn(3, 4, 9, generator=torch.Generator().manual_seed(2))
    probs = process_logits(logits, SamplingParams(0.9, 5, 0.8))
    np.testing.assert_allclose(probs.double().numpy(), naive_process(logits, [0.9] * 3, [5] * 3, [0.8] * 3), atol=2e-6)


def test_all_greedy_is_one_hot_argmax():
    logits = torch.randn(4, 3, 11, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    probs = process_logits(logits, SamplingParams(0.0))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4, 3))


def test_tiny_temperature_does_not_overflow():
    logits = torch.tensor([[50.0, 49.0, -30.0]])
    probs = process_logits(logits, SamplingParams(1e-6))
    assert torch.isfinite(probs).all()
    assert probs[0, 0].item() == 1.0


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": torch.tensor([1.0, -1.0])}, "temperature"),
        ({"temperature": torch.tensor([1.0, math.inf])}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": torch.tensor([0.5, 0.0])}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_k": torch.tensor([1.0, 2.0])}, "top_k"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": torch.ones(2, 2)}, "temperature"),
    ],
)
def test_bad_params_raise_naming_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_tensor_params_of_different_lengths_raise():
    with pytest.raises(ValueError, match="different lengths"):
        SamplingParams(torch.ones(3), torch.ones(2, dtype=torch.int64))


def test_wrong_batch_length_raises():
    params = SamplingParams(torch.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        process_logits(torch.randn(2, 5), params)


def test_mismatched_device_raises():
    params = SamplingParams(torch.ones(2), torch.full((2,), -1), torch.ones(2))
    with pytest.raises(ValueError, match="temperature is on cpu"):
        params.broadcast(2, "meta")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logits_raise(bad):
    logits = torch.randn(2, 3, 5)
    logits[1, 2, 4] = bad
    with pytest.raises(ValueError, match="logits"):
        process_logits(logits, SamplingParams(1.0))


def test_bad_logits_rank_raises():
    with pytest.raises(ValueError, match="logits"):
        process_logits(torch.randn(5), SamplingParams(1.0))


def test_bf16_logits_are_processed_in_fp32():
    logits = (torch.randn(4, 6, 50, generator=torch.Generator().manual_seed(4)) * 4).to(torch.bfloat16)
    probs = process_logits(logits, SamplingParams(0.7, 10, 0.9))
    reference = naive_process(logits.float(), [0.7] * 4, [10] * 4, [0.9] * 4)
    np.testing.assert_allclose(probs.double().numpy(), reference, atol=2e-6)
