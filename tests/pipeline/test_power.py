"""The losslessness tests can fail: independent seeds, the power panel's lossy verifiers rejected, the exact not.

Every test decision here is at alpha = 0.01 with fixed seeds (deterministic: a rerun gives the same draw).
"""

from __future__ import annotations

import math

import pytest
import torch

from ddtree.bench.acceptance import plan_jobs
from ddtree.bench.http_client import Prompt
from ddtree.core.build import build_tree
from ddtree.core.lossy_verifiers import LOSSY_VERIFIERS, SAMPLING_VERIFIERS, get_verifier
from ddtree.core.sampling import SamplingParams
from ddtree.pipeline.aggregate import acceptance_test_table, sampling_test_table
from ddtree.pipeline.config import build_plan, parse_run_id, power_panel_runs, run_verifier
from ddtree.pipeline.lossless import acceptance_z_test, chi2_detectable_w

from test_config import CONFIG, PROFILE

ALPHA = 0.01


def _plan(run, tmp_path, config=CONFIG):
    """The plan as the session reads it from disk."""
    return build_plan(config, "cpu", PROFILE, "embedded-small", run, model_dir="m", prompts="p.jsonl",
                      num_prompts=4, out_dir=str(tmp_path / run), server_log="s.log").to_json()


def test_ar_and_each_speculative_run_draw_independent_seeds(tmp_path):
    prompts = [Prompt(id=f"p{i}", dataset="d", text="x") for i in range(4)]
    variants = [dict(v) for v in CONFIG["variants"]]
    seeds = {}
    for run in ("ar", "dflash", "ddtree-b8", "ddtree-b32"):
        acc = _plan(run, tmp_path)["acceptance"]
        assert acc["seed_salt"] == run
        jobs = plan_jobs(prompts, variants, acc["samples_per_prompt"], acc["seed_salt"])
        seeds[run] = {job.seed for job in jobs}
        assert len(seeds[run]) == len(jobs)  # distinct within a run
    runs = list(seeds)
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            assert not seeds[a] & seeds[b], f"{a} and {b} share request seeds"


def test_power_panel_plans_run_a_lossy_verifier_on_its_variants(tmp_path):
    config = {**CONFIG, "lossless": {"alpha": ALPHA, "positions": [1, 2],
                                     "power_panel": {"budget": 8, "verifiers": ["greedy_accept"], "variants": ["t1"]}}}
    (run,) = power_panel_runs(config)
    assert run == "ddtree-b8-lossy-greedy_accept" and parse_run_id(run) == ("ddtree", 8)
    assert run_verifier(run) == "greedy_accept" and run_verifier("ddtree-b8") == "exact"
    plan = _plan(run, tmp_path, config)
    assert plan["server"]["extra_args"][-2:] == ["--verifier", "greedy_accept"]
    assert [v["name"] for v in plan["acceptance"]["variants"]] == ["t1"] and "throughput" not in plan
    assert plan["tags"]["verifier"] == "greedy_accept"
    assert "--verifier" not in _plan("ddtree-b8", tmp_path, config)["server"]["extra_args"]


# ---- the verifiers themselves: law of the first emitted token on a fixed tree, against the exact law ----

def _one_level_tree():
    """Root with children tokens 0 and 1 (one depth); target at the root: p = [0.5, 0.3, 0.2] (T = 1)."""
    logits = torch.tensor([[[4.0, 3.0, -5.0]]])  # drafter [1, D=1, V=3]: children 0, 1
    tree = build_tree(logits, 2, method="heap")
    p = torch.tensor([0.5, 0.3, 0.2])
    target = torch.log(p).expand(1, 3, 3).clone()  # [1, N=3, V]: same distribution at every node
    return tree, target, p


def _first_token_counts(name: str, draws: int, params: SamplingParams) -> torch.Tensor:
    tree, target, _ = _one_level_tree()
    verify = get_verifier(name)
    gen = torch.Generator().manual_seed(11)
    counts = torch.zeros(3)
    for _ in range(draws):
        res = verify(tree, target, params, gen, max_depth=1)
        first = int(tree.token_ids[0, int(res.accepted_nodes[0, 1])]) if int(res.accept_len[0]) else int(res.bonus_token[0])
        counts[first] += 1
    return counts


def _gof_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value; a draw of a token the law cannot emit gives p = 0."""
    from scipy.stats import chisquare

    keep = probs > 0
    if counts[~keep].sum() > 0:
        return 0.0
    return float(chisquare(counts[keep].numpy(), (probs[keep] * counts.sum()).numpy()).pvalue)


@pytest.mark.parametrize("name", sorted(SAMPLING_VERIFIERS))
def test_first_token_law_exact_accepted_lossy_rejected(name):
    """3,000 draws (fixed seed; a false rejection has probability alpha): exact law p = [0.5, 0.3, 0.2]. greedy_accept gives [0.5 + 0.2 * 0.5, 0.3 + ..] (child 0 always
    accepted: P(0) = 1); bonus_redraw gives P(0) = 0.5 + 0.2 * 0.5 = 0.6; ignore_top_k_top_p under top_k = 2 gives
    the untruncated law with mass 0.2 on token 2 (exact under top_k = 2: [0.625, 0.375, 0])."""
    params = SamplingParams(temperature=1.0, top_k=2) if name == "ignore_top_k_top_p" else SamplingParams(temperature=1.0)
    exact_law = torch.tensor([0.625, 0.375, 0.0]) if name == "ignore_top_k_top_p" else torch.tensor([0.5, 0.3, 0.2])
    p = _gof_p(_first_token_counts(name, 3000, params), exact_law)
    if name == "exact":
        assert p >= ALPHA
        assert _gof_p(_first_token_counts(name, 3000, SamplingParams(temperature=1.0, top_k=2)),
                      torch.tensor([0.625, 0.375, 0.0])) >= ALPHA
    else:
        assert p < ALPHA, f"{name} not rejected (p = {p})"


# ---- through the engine and the pipeline's tables, on the trained tiny pair ----

def _records(engine, prompts, variant, run_tags, samples):
    from ddtree.bench.http_client import derive_seed
    from ddtree.engine.types import GenerationRequest

    records = []
    for pid, ids in prompts:
        for s in range(samples):
            seed = derive_seed(run_tags["run"], pid, variant["name"], s)
            out = engine.generate(GenerationRequest(input_ids=ids, max_new_tokens=12, temperature=variant["temperature"],
                                                    top_k=variant["top_k"], top_p=variant["top_p"], seed=seed))
            records.append({**{k: v for k, v in run_tags.items() if k != "run"}, "prompt_id": pid,
                            "variant": variant["name"], "temperature": variant["temperature"], "sample_index": s,
                            "accept_lens": out.accept_lens, "expected_accept_lens": out.expected_accept_lens,
                            "output_ids": out.output_ids, "error": None})
    return records


@pytest.mark.slow
def test_pipeline_tests_reject_the_lossy_verifier_and_pass_the_exact_one(tiny_pair):
    from ddtree.engine.engine import DecodingEngine
    from ddtree.models.pair import load_pair
    from ddtree.jsonl import read_jsonl

    pair = load_pair(tiny_pair)
    prompts = [(str(i), pair.tokenizer(rec["text"]).input_ids[-48:])
               for i, rec in enumerate(read_jsonl(tiny_pair / "prompts" / "heldout.jsonl")[:6])]
    variant = {"name": "t1", "temperature": 1.0, "top_k": -1, "top_p": 1.0}
    base = {"profile": "cpu", "pair": "tiny"}
    records = _records(DecodingEngine(pair, method="ar"), prompts, variant,
                       {**base, "method": "ar", "budget": None, "verifier": "exact", "run": "ar"}, 40)
    for verifier in ("exact", "greedy_accept"):
        engine = DecodingEngine(pair, method="ddtree", budget=8, verifier=verifier)
        records += _records(engine, prompts, variant, {**base, "method": "ddtree", "budget": 8, "verifier": verifier,
                                                      "run": f"ddtree-b8-{verifier}"}, 40)
    z = acceptance_test_table(records, alpha=ALPHA).set_index("verifier")
    assert not z.loc["exact", "reject"] and z.loc["exact", "p_value"] >= ALPHA
    assert z.loc["greedy_accept", "reject"] and abs(z.loc["greedy_accept", "z"]) > 5
    assert z.loc["exact", "detectable_bias"] < 0.2  # power in words: a 0.2-draft bias is caught w.p. >= 0.9
    chi = sampling_test_table(records, positions=(1, 2, 3), alpha=ALPHA)
    combined = chi[chi["position"] == -1].set_index("verifier")
    assert not combined.loc["exact", "reject"]
    assert combined.loc["greedy_accept", "reject"]


def test_power_statements_are_what_they_say():
    """detectable_bias: a shift of that size is rejected ~90% of the time; w: noncentral chi-square power 0.9."""
    from scipy.stats import chi2, ncx2

    gen = torch.Generator().manual_seed(3)
    expected = torch.rand(400, generator=gen)
    noise = torch.rand((300, 400), generator=gen)
    accepted = (noise < expected).float()  # Bernoulli(e): lossless rounds
    bias = acceptance_z_test(accepted[0].tolist(), expected.tolist(), alpha=ALPHA)["detectable_bias"]
    rejections = sum(acceptance_z_test((accepted[i] + bias).tolist(), expected.tolist(), alpha=ALPHA)["reject"]
                     for i in range(300))
    assert 0.8 <= rejections / 300 <= 0.97
    null = sum(acceptance_z_test(accepted[i].tolist(), expected.tolist(), alpha=ALPHA)["reject"] for i in range(300))
    assert null / 300 <= 0.04
    w = chi2_detectable_w(200, 4, ALPHA / 4)
    assert ncx2.sf(chi2.isf(ALPHA / 4, 4), 4, 200 * w * w) == pytest.approx(0.9, abs=1e-6)
    assert math.isnan(chi2_detectable_w(0, 4, ALPHA))
    assert set(LOSSY_VERIFIERS) == set(SAMPLING_VERIFIERS) - {"exact"}
