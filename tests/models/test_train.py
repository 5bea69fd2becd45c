import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.models.train import (
    _heap_tree,
    chain_accept_len,
    lr_at,
    sample_anchors,
    tree_accept_len,
    tree_for,
)


def test_chain_and_tree_acceptance_walks():
    assert chain_accept_len([5, 6, 7], [5, 6, 9]) == 2
    assert chain_accept_len([5], [4]) == 0
    # root 0 -> 1:(a=5) -> 3:(c=7); root -> 2:(b=6) -> 4:(d=8)
    tokens, parents = [5, 6, 7, 8], [0, 0, 1, 2]
    assert tree_accept_len(tokens, parents, [6, 8, 1]) == 2
    assert tree_accept_len(tokens, parents, [5, 8]) == 1
    assert tree_accept_len(tokens, parents, [9]) == 0


def test_fallback_heap_tree_matches_core_builder():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 40, generator=g) * 2
    tokens, parents = _heap_tree(logits, 16)
    assert len(tokens) == 16 and all(p < i for i, p in enumerate(parents, start=1))
    # the chain of per-position argmaxes prefix-closed: first node is the depth-1 argmax
    assert tokens[0] == int(logits[0].argmax())
    core_tokens, core_parents = tree_for(logits, 16)
    # same node SET (paths) whichever builder is used
    def paths(tok, par):
        out = set()
        for i in range(1, len(tok) + 1):
            p, node = [], i
            while node:
                p.append(tok[node - 1])
                node = par[node - 1]
            out.add(tuple(reversed(p)))
        return out
    assert paths(tokens, parents) == paths(core_tokens, core_parents)


def test_tree_contains_chain_when_drafter_is_confident():
    logits = torch.full((7, 30), -10.0)
    logits[torch.arange(7), torch.arange(7)] = 10.0
    tokens, parents = tree_for(logits, 8)
    assert tree_accept_len(tokens, parents, list(range(7))) == 7


def test_anchors_and_schedule():
    g = torch.Generator().manual_seed(0)
    a = sample_anchors(3, 10, 64, 8, g)
    assert a.shape == (3, 10) and int(a.min()) >= 1 and int(a.max()) <= 64 - 8
    assert bool((a[:, 1:] > a[:, :-1]).all())
    assert lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)


@pytest.mark.slow
def test_tiny_pair_trains_and_drafts_better_than_chance(tiny_pair):
    from ddtree.models.pair import load_pair
    from ddtree.jsonl import read_jsonl
    from ddtree.models.train import evaluate_acceptance

    manifest = json.loads((tiny_pair / "manifest.json").read_text())
    t = manifest["training"]
    assert t["target"]["steps"] > 0 and t["drafter"]["steps"] > 0
    assert t["target"]["heldout_loss"] < math.log(manifest["vocab_size"])  # learned something
    assert manifest["corpus"]["num_heldout"] > 0 and len(manifest["corpus"]["files"]) > 0
    prompts = read_jsonl(tiny_pair / "prompts" / "heldout.jsonl")
    assert len(prompts) == manifest["prompts"]["count"] and prompts[0]["dataset"] == "stdlib-heldout"
    pair = load_pair(tiny_pair)
    res = evaluate_acceptance(pair, prompts, num_prompts=4, max_new_tokens=24)
    # a random drafter over a 512-token vocabulary essentially never matches: tau ~ 1
    assert res["dflash_tau"] > 1.2
    assert res["ddtree32_tau"] >= 1.0


def test_batched_greedy_rollouts_match_single_sequence_decoding(untrained_pair):
    from ddtree.models.pair import load_pair
    from ddtree.models.train import greedy_continuation, greedy_extend

    pair = load_pair(untrained_pair)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, 300, (3, 10), generator=g)
    with torch.no_grad():
        out = greedy_extend(pair.target, prompts, 6)
    assert out.shape == (3, 16) and torch.equal(out[:, :10], prompts)
    for row in range(3):
        assert out[row, 10:].tolist() == greedy_continuation(pair.target, prompts[row].tolist(), 6, "cpu")


def test_batched_evaluator_matches_per_round_drafting(untrained_pair):
    """all_block_logits (one masked forward) == one inference-style draft_logits call per start."""
    from ddtree.models.drafter import draft_logits
    from ddtree.models.pair import load_pair
    from ddtree.models.train import all_block_logits

    pair = load_pair(untrained_pair)
    seq = list(range(5, 40))
    with torch.no_grad():
        out = pair.target(input_ids=torch.tensor([seq]), output_hidden_states=True)
        feats = pair.drafter.extract_context(out.hidden_states)
        starts = [4, 11, 20]
        batched = all_block_logits(pair.drafter, pair.embed_tokens, pair.lm_head, seq, feats, starts)
        for i, s in enumerate(starts):
            single = draft_logits(pair.drafter, pair.embed_tokens, pair.lm_head, torch.tensor([seq[s]]), s,
                                  feats[:, :s], None)[0]
            torch.testing.assert_close(batched[i], single, atol=1e-4, rtol=1e-4)


def test_thread_picker_keeps_the_faster_count():
    from ddtree.models.train import ThreadPicker

    before = torch.get_num_threads()
    try:
        picker = ThreadPicker(2, reprobe_s=1e9)
        fake = {1: 0.1, 2: 0.5}  # one thread is faster here
        for step in range(8):
            picker.before_step(step, elapsed=float(step))
            picker.after_step(step, fake[picker.current])
        assert picker.current == 1
    finally:
        torch.set_num_threads(before)


def test_cached_pool_features_give_the_same_drafter_loss(untrained_pair):
    """The drafter loop reads the frozen target's features from a cache built once per rollout pool:
    the loss and its gradients must equal those of running the target inside the step."""
    from ddtree.models.pair import load_pair
    from ddtree.models.train import drafter_batch_loss, pool_features, position_weights

    pair = load_pair(untrained_pair)
    target, drafter = pair.target, pair.drafter
    cfg = drafter.config
    gen = torch.Generator().manual_seed(0)
    pool = torch.randint(0, cfg.vocab_size, (6, 48), generator=gen)
    cached = pool_features(target, pool, cfg.target_layer_ids, device=torch.device("cpu"), autocast=False, chunk=4)
    assert cached is not None and cached[0].shape == (6, 48, len(cfg.target_layer_ids) * cfg.hidden_size)
    rows = torch.tensor([4, 1, 1])
    anchors = sample_anchors(3, 3, 48, cfg.block_size, gen)
    w = position_weights(cfg.block_size, 4.0, torch.device("cpu"))
    grads = []
    for pre in (None, (cached[0][rows], cached[1][rows])):
        drafter.zero_grad(set_to_none=True)
        loss, acc, _ = drafter_batch_loss(target, drafter, pool[rows], anchors, w, "greedy", precomputed=pre)
        loss.backward()
        grads.append((float(loss.detach()), acc, [p.grad.clone() for p in drafter.parameters() if p.grad is not None]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    assert torch.equal(grads[0][1], grads[1][1])
    for a, b in zip(grads[0][2], grads[1][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_pool_features_skip_the_cache_when_too_large(untrained_pair, monkeypatch):
    from ddtree.models import train
    from ddtree.models.pair import load_pair

    pair = load_pair(untrained_pair)
    monkeypatch.setattr(train, "POOL_FEATURE_CACHE_BYTES", 1024)
    pool = torch.zeros((4, 32), dtype=torch.long)
    cfg = pair.drafter.config
    assert train.pool_features(pair.target, pool, cfg.target_layer_ids, device=torch.device("cpu"),
                               autocast=False) is None


def test_small_size_trains_the_drafter_past_the_positions_decoding_reaches():
    from ddtree.models.sizes import get_size

    small = get_size("small")
    # longest held-out prompt (~130 tokens) + the pipeline's and bench's max_new_tokens (<= 128) + one block
    assert small.rollout_len >= 130 + 128 + small.block_size
    assert get_size("tiny").rollout_len == get_size("tiny").seq_len


def test_gpu_size_is_consistent():
    """The H200 preset: drafter positions cover prompt (<= ~200 tokens at its vocabulary) + 128 new + one
    block, every rollout leaves room for its anchors after the prompt, and both configs build."""
    from ddtree.models.sizes import drafter_config, get_size, target_config

    gpu = get_size("gpu")
    assert gpu.rollout_len >= 200 + 128 + gpu.block_size and gpu.seq_len >= gpu.rollout_len
    assert gpu.anchors_after_prompt and gpu.schedule == "steps" and gpu.block_size == 16
    longest_prompt = gpu.rollout_len // 2  # rollout_pool's upper bound
    assert gpu.rollout_len - gpu.block_size - longest_prompt + 1 >= gpu.drafter_anchors
    assert gpu.num_heads * gpu.head_dim == gpu.hidden_size
    assert all(0 <= i < gpu.target_layers for i in gpu.target_layer_ids)
    assert gpu.drafter_layers < gpu.target_layers
    tcfg = target_config(gpu, gpu.vocab_size, 0)
    dcfg = drafter_config(gpu, gpu.vocab_size, 1)
    assert tcfg.num_hidden_layers == gpu.target_layers and dcfg.block_size == 16


def test_random_windows_are_slices_of_the_stream():
    from ddtree.models.train import random_windows

    stream = torch.arange(1000) * 3
    w = random_windows(stream, 5, 17, torch.Generator().manual_seed(1))
    assert w.shape == (5, 17)
    for row in w:
        start = int(row[0]) // 3
        assert torch.equal(row, stream[start : start + 17])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(20, 60))
def test_anchors_respect_each_rows_lower_bound(seed, num, seq_len):
    block = 4
    hi = seq_len - block
    g = torch.Generator().manual_seed(seed)
    lo = torch.randint(1, hi - num + 2, (3,), generator=g)  # leaves >= num positions in [lo, hi]
    a = sample_anchors(3, num, seq_len, block, g, lo)
    assert a.shape == (3, num)
    assert bool((a >= lo.unsqueeze(1)).all()) and int(a.max()) <= hi
    assert bool((a[:, 1:] > a[:, :-1]).all())


def test_run_loop_takes_float_or_tensor_losses():
    from ddtree.models.train import run_loop

    w = torch.nn.Parameter(torch.tensor(2.0))

    def tensor_step(_: int) -> torch.Tensor:
        loss = (w - 1.0) ** 2
        loss.backward()
        return loss.detach()

    for step_fn in (tensor_step, lambda s: float(tensor_step(s))):
        res = run_loop(step_fn, [w], peak_lr=0.1, budget_s=60, max_steps=5, log_every=2, desc="t",
                       progress=False, log_file=None, schedule="steps")
        assert res.steps == 5 and isinstance(res.final_loss, float) and math.isfinite(res.final_loss)


def test_bf16_target_feature_cache_holds_its_features(untrained_pair):
    from ddtree.models.pair import load_pair
    from ddtree.models.train import pool_features, target_features

    pair = load_pair(untrained_pair, dtype=torch.bfloat16)
    cfg = pair.drafter.config
    pool = torch.randint(0, cfg.vocab_size, (5, 24), generator=torch.Generator().manual_seed(0))
    feats, greedy = pool_features(pair.target, pool, cfg.target_layer_ids, device=torch.device("cpu"),
                                  autocast=False, chunk=2)
    assert feats.dtype == torch.bfloat16  # the target's dtype: no loss, half the bytes of fp32
    ref_f, ref_g = target_features(pair.target, pool, cfg.target_layer_ids)
    assert torch.equal(feats, ref_f.to(torch.bfloat16)) and torch.equal(greedy, ref_g)


def test_drafter_trains_against_a_bf16_target_on_rollouts_anchored_after_the_prompt(untrained_pair):
    """The gpu preset's path (bf16 frozen target, cached bf16 features, bf16 autocast, anchors after each
    prompt) on the tiny shapes, a few steps on the CPU."""
    import dataclasses

    from ddtree.models.pair import load_pair
    from ddtree.models.sizes import get_size
    from ddtree.models.train import train_drafter

    pair = load_pair(untrained_pair)
    target = pair.target.to(torch.bfloat16)
    spec = dataclasses.replace(get_size("tiny"), anchors_after_prompt=True, drafter_max_steps=3, rollout_rows=8,
                               drafter_batch=4, seq_len=48)
    stream = torch.randint(2, spec.vocab_size, (4000,), generator=torch.Generator().manual_seed(0))
    res, acc, info = train_drafter(target, pair.drafter.float(), stream, spec, seed=0, device=torch.device("cpu"),
                                   budget_s=120, progress=False, autocast=True)
    assert res.steps == 3 and res.stopped_by == "max_steps" and math.isfinite(res.final_loss)
    assert info["pool_features_cached"] and info["rollout_rows"] == 8
    assert len(acc) == spec.block_size - 1 and 1.0 <= info["last_batch_tau"] <= spec.block_size


def test_evaluate_acceptance_reports_every_budget(untrained_pair):
    from ddtree.models.pair import load_pair
    from ddtree.models.train import evaluate_acceptance

    pair = load_pair(untrained_pair)
    prompts = [{"text": "def add(a, b):\n    return a + b\n"}, {"text": "import os\nimport sys\n"}]
    res = evaluate_acceptance(pair, prompts, max_new_tokens=10, budgets=(2, 8), num_prompts=2)
    assert res["budgets"] == [2, 8] and res["dflash_tau"] >= 1.0
    for B in (2, 8):
        assert 1.0 <= res[f"ddtree{B}_tau"] <= pair.drafter.config.block_size
        assert res[f"ddtree{B}_over_dflash"] == pytest.approx(res[f"ddtree{B}_tau"] / res["dflash_tau"], abs=1e-3)
    assert 0.0 <= res["target_entropy_on_greedy"] <= math.log(pair.drafter.config.vocab_size) + 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_size_scaled_down_trains_and_evaluates_on_cuda(tmp_path):
    """Every CUDA path of the gpu preset (device-side sampling, fused AdamW, bf16 frozen target, feature
    cache on the GPU, evaluation in bf16) on tiny shapes."""
    import dataclasses

    from ddtree.models.sizes import get_size
    from ddtree.models.train import train_pair

    spec = dataclasses.replace(
        get_size("gpu"), name="gpu-test", vocab_size=512, hidden_size=64, target_layers=2, target_intermediate=128,
        num_heads=4, num_kv_heads=2, head_dim=16, drafter_layers=1, drafter_intermediate=128,
        target_layer_ids=(0, 1), seq_len=128, target_batch=8, target_max_steps=12, drafter_batch=8,
        drafter_max_steps=12, rollout_rows=64, corpus_max_train_bytes=300_000, tokenizer_max_bytes=200_000,
        max_position_embeddings=1024)
    m = train_pair(tmp_path, size=spec, device="cuda", progress=False, eval_prompts=2)
    t, d = m["training"]["target"], m["training"]["drafter"]
    assert t["steps"] == 12 and d["steps"] == 12 and d["pool_features_cached"]
    assert math.isfinite(t["heldout_loss"]) and m["metrics"]["acceptance_t0"]["dflash_tau"] >= 1.0
