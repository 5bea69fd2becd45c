import pytest
import torch

from ddtree.models import load_pair
from ddtree.models.drafter import draft_logits


def test_untrained_pair_loads_and_drafts(untrained_pair):
    pair = load_pair(untrained_pair)
    assert pair.target.dtype == torch.float32
    tok = pair.tokenizer
    assert tok.convert_tokens_to_ids("<|mask|>") == pair.config.mask_token_id
    assert tok.eos_token == "<|endoftext|>"
    ids = tok("x = 1\n").input_ids
    out = pair.target(torch.tensor([ids]), output_hidden_states=True)
    ctx = pair.drafter.extract_context(out.hidden_states)
    logits = draft_logits(pair.drafter, pair.embed_tokens, pair.lm_head, torch.tensor([ids[-1]]), len(ids),
                          ctx, None)
    assert logits.shape == (1, pair.config.block_size - 1, pair.target.config.vocab_size)


def test_load_pair_names_missing_parts(tmp_path, untrained_pair):
    with pytest.raises(FileNotFoundError, match="pair directory"):
        load_pair(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="target directory"):
        load_pair(tmp_path)
    pair = load_pair(untrained_pair, dtype=torch.bfloat16)
    assert pair.drafter.fc.weight.dtype == torch.bfloat16
