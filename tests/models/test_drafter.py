import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ddtree.models.drafter import (
    DFlashConfig,
    DFlashDrafter,
    build_target_layer_ids,
    draft_logits,
    training_block_mask,
)


def make_drafter(seed: int = 0, layers: int = 2, block: int = 6) -> DFlashDrafter:
    torch.manual_seed(seed)
    cfg = DFlashConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=50, block_size=block, mask_token_id=1,
        target_layer_ids=[0, 2], rope_theta=10_000.0,
    )
    d = DFlashDrafter(cfg).eval()
    d.reset_parameters(std=0.2)  # larger weights so differences are visible
    return d


def rand(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def test_forward_shapes_and_extract_context():
    d = make_drafter()
    hs = tuple(rand(2, 9, 32, seed=i) for i in range(4))  # embeddings + 3 layers
    ctx = d.extract_context(hs)
    assert ctx.shape == (2, 9, 32)
    # layer l is index l + 1: layers 0 and 2 -> indices 1 and 3
    manual = d.hidden_norm(d.fc(torch.cat([hs[1], hs[3]], dim=-1)))
    torch.testing.assert_close(ctx, manual)
    out = d(rand(2, 6, 32), torch.arange(9, 15).expand(2, 6), ctx, torch.arange(9).expand(2, 9))
    assert out.shape == (2, 6, 32)
    with pytest.raises(ValueError, match="target_layer_ids"):
        d.extract_context(hs[:3])
    with pytest.raises(ValueError, match="block_positions"):
        d(rand(2, 6, 32), torch.arange(5).expand(2, 5), ctx, torch.arange(9).expand(2, 9))


def test_cached_incremental_context_equals_full_recompute():
    d = make_drafter()
    ctx = rand(1, 12, 32)
    blk = rand(1, 6, 32, seed=7)
    bpos = torch.arange(12, 18).unsqueeze(0)
    full = d(blk, bpos, ctx, torch.arange(12).unsqueeze(0))
    cache = d.new_cache()
    out = None
    for lo, hi in [(0, 5), (5, 9), (9, 12)]:
        out = d(blk, torch.arange(hi, hi + 6).unsqueeze(0) if hi < 12 else bpos,
                ctx[:, lo:hi], torch.arange(lo, hi).unsqueeze(0), cache)
        assert cache.length == hi
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    # crop then re-append the same features: identical again
    cache.crop(7)
    assert cache.length == 7
    again = d(blk, bpos, ctx[:, 7:], torch.arange(7, 12).unsqueeze(0), cache)
    torch.testing.assert_close(again, full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.crop(99)


def test_block_attention_is_non_causal():
    d = make_drafter()
    ctx = rand(1, 5, 32)
    blk = rand(1, 6, 32, seed=3)
    pos = torch.arange(5, 11).unsqueeze(0)
    a = d(blk, pos, ctx, torch.arange(5).unsqueeze(0))
    blk2 = blk.clone()
    blk2[:, -1] += 1.0  # change only the LAST block position
    b = d(blk2, pos, ctx, torch.arange(5).unsqueeze(0))
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4  # the first position sees it


def test_context_keys_use_their_own_positions():
    # shifting every position by the same amount leaves RoPE attention unchanged
    d = make_drafter()
    ctx, blk = rand(1, 5, 32), rand(1, 6, 32, seed=3)
    a = d(blk, torch.arange(5, 11).unsqueeze(0), ctx, torch.arange(5).unsqueeze(0))
    b = d(blk, torch.arange(105, 111).unsqueeze(0), ctx, torch.arange(100, 105).unsqueeze(0))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    c = d(blk, torch.arange(5, 11).unsqueeze(0), ctx, torch.arange(0, 10, 2).unsqueeze(0))
    assert (a - c).abs().max() > 1e-4


def test_training_layout_matches_inference_drafting():
    """Many anchors in one masked forward == one inference-style drafting call per anchor."""
    d = make_drafter()
    T, b = 20, d.config.block_size
    emb = torch.nn.Embedding(50, 32)
    head = torch.nn.Linear(32, 50, bias=False)
    torch.manual_seed(5)
    tokens = torch.randint(2, 50, (1, T))
    ctx = rand(1, T, 32)
    anchors = torch.tensor([[3, 9, 14]])
    ids = torch.full((1, 3, b), d.config.mask_token_id)
    ids[:, :, 0] = tokens[0, anchors[0]]
    blk_pos = (anchors.unsqueeze(-1) + torch.arange(b)).reshape(1, -1)
    mask = training_block_mask(anchors, T, b)
    train_h = d(emb(ids.reshape(1, -1)), blk_pos, ctx, torch.arange(T).unsqueeze(0), attention_mask=mask)
    train_logits = head(train_h.view(1, 3, b, 32)[:, :, 1:])  # [1, M, D, V]
    for m, a in enumerate(anchors[0].tolist()):
        cache = d.new_cache()
        inf = draft_logits(d, emb, head, tokens[:, a], a, ctx[:, :a], cache)
        torch.testing.assert_close(inf, train_logits[:, m], atol=1e-5, rtol=1e-5)
        assert cache.length == a


def test_save_load_round_trip(tmp_path):
    d = make_drafter()
    d.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["block_size"] == 6 and cfg["dflash_config"]["target_layer_ids"] == [0, 2]
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.1.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight"} <= keys
    e = DFlashDrafter.from_pretrained(tmp_path)
    ctx, blk = rand(1, 5, 32), rand(1, 6, 32, seed=3)
    args = (blk, torch.arange(5, 11).unsqueeze(0), ctx, torch.arange(5).unsqueeze(0))
    torch.testing.assert_close(d(*args), e(*args))


def test_loads_hub_style_checkpoint(tmp_path):
    """`model.` prefix, rope_parameters, extra tensors and unknown config keys are tolerated."""
    d = make_drafter()
    cfg = d.config.to_dict()
    cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_theta": 10_000.0, "rope_type": "default"}
    cfg["some_future_key"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = {f"model.{k}": v.contiguous() for k, v in d.state_dict().items()}
    state["embed_tokens.weight"] = torch.zeros(50, 32)
    save_file(state, str(tmp_path / "model.safetensors"))
    e = DFlashDrafter.from_pretrained(tmp_path)
    assert e.config.rope_theta == 10_000.0 and e.config.extra["some_future_key"] == 3
    ctx, blk = rand(1, 5, 32), rand(1, 6, 32, seed=3)
    args = (blk, torch.arange(5, 11).unsqueeze(0), ctx, torch.arange(5).unsqueeze(0))
    torch.testing.assert_close(d(*args), e(*args))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        DFlashDrafter.from_pretrained(tmp_path)


def test_config_errors_and_default_layers():
    with pytest.raises(ValueError, match="block_size"):
        DFlashConfig.from_dict({"hidden_size": 8, "dflash_config": {"mask_token_id": 1}})
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(4, 1) == [2]


def test_refuses_unknown_parameters_and_reads_top_level_dflash_keys(tmp_path):
    d = make_drafter()
    d.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    dfl = cfg.pop("dflash_config")
    cfg.update(dfl)  # mask_token_id / target_layer_ids at the top level
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    e = DFlashDrafter.from_pretrained(tmp_path)
    assert e.config.target_layer_ids == [0, 2] and e.config.mask_token_id == 1
    state = {k: v.contiguous() for k, v in d.state_dict().items()}
    state["layers.0.attention_conv.base_kernel"] = torch.zeros(2, 2, 32)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unsupported"):
        DFlashDrafter.from_pretrained(tmp_path)
