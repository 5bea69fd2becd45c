"""Target KV cache: tree forward with the custom 4D mask, compaction to the accepted path == fresh prefill."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ddtree.engine.kv import BufferedLayer, cache_keyword, cache_length, keep_rows, new_cache


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # spread the logits so that comparisons are meaningful
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def _forward(model, ids, positions, cache=None, mask=None):
    kwargs = {cache_keyword(model): cache} if cache is not None else {}
    return model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=cache is not None, **kwargs)


def _tree_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool ancestor-or-self mask from a parent list (root parent -1)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def _additive(committed: int, tree_mask: torch.Tensor) -> torch.Tensor:
    n = tree_mask.shape[0]
    mask = torch.zeros(1, 1, n, committed + n)
    mask[0, 0, :, committed:].masked_fill_(~tree_mask, torch.finfo(torch.float32).min)
    return mask


@pytest.mark.parametrize("accepted", [[0, 2, 5], [0, 1, 3, 4], [0], [0, 1]])
def test_tree_verify_then_compaction_equals_prefill(target, accepted):
    torch.manual_seed(1)
    prompt = torch.randint(0, 97, (1, 9))  # [1, L]
    committed = prompt.shape[1]
    # root 0; children 1, 2; 3 under 1; 4 under 3; 5 under 2; 6 under 0
    parents = [-1, 0, 0, 1, 3, 2, 0]
    depths = torch.tensor([[0, 1, 1, 2, 3, 2, 1]])
    tokens = torch.randint(0, 97, (1, len(parents)))  # [1, N]
    cache = new_cache(target, 64)
    with torch.inference_mode():
        _forward(target, prompt, torch.arange(committed)[None], cache)
        tree_out = _forward(target, tokens, committed + depths, cache, _additive(committed, _tree_mask(parents)))
        assert cache_length(cache) == committed + len(parents)
        # every node sees exactly the prompt and its ancestors
        for node in range(len(parents)):
            path = [j for j in range(len(parents)) if _tree_mask(parents)[node, j]]
            full = _forward(target, torch.cat([prompt, tokens[:, path]], 1), None).logits  # positions implicit
            assert torch.allclose(tree_out.logits[0, node], full[0, -1], atol=1e-5)

        contiguous = accepted == list(range(len(accepted)))
        rows = None if contiguous else torch.tensor(accepted)
        keep_rows(cache, committed, rows, len(accepted))
        assert cache_length(cache) == committed + len(accepted)

        kept = torch.cat([prompt, tokens[:, accepted]], 1)  # committed tokens after the round
        fresh = new_cache(target, 64)
        _forward(target, kept, torch.arange(kept.shape[1])[None], fresh)
        for layer, ref in zip(cache.layers, fresh.layers):
            assert torch.allclose(layer.keys, ref.keys, atol=1e-5)
            assert torch.allclose(layer.values, ref.values, atol=1e-5)
        nxt = torch.tensor([[5]])
        pos = torch.tensor([[kept.shape[1]]])
        a = _forward(target, nxt, pos, cache).logits
        b = _forward(target, nxt, pos, fresh).logits
        assert torch.allclose(a, b, atol=1e-5)


def test_buffered_layer_capacity_and_crop(target):
    cache = new_cache(target, 12)
    assert all(isinstance(layer, BufferedLayer) for layer in cache.layers)
    with torch.inference_mode():
        _forward(target, torch.randint(0, 97, (1, 10)), torch.arange(10)[None], cache)
        cache.crop(-3)  # transformers 5: a negative count of rows to drop
        assert cache.get_seq_length() == 7
        with pytest.raises(ValueError, match="capacity"):
            _forward(target, torch.randint(0, 97, (1, 6)), torch.arange(7, 13)[None], cache)
