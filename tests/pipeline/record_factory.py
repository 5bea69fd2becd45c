"""Benchmark records (`ddtree.bench.schema`, in their on-disk form), generated for the pipeline tests."""

from __future__ import annotations

import numpy as np

from ddtree.bench.schema import AcceptanceRecord, ThroughputRecord

VARIANTS = [
    {"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0},
    {"name": "t1", "temperature": 1.0, "top_k": -1, "top_p": 1.0},
]


def acceptance_record(tags, prompt_id, variant, output_ids, accept_lens, *, decode_time, sample_index=0):
    rounds = len(accept_lens)
    return AcceptanceRecord(
        tags=tags, prompt_id=prompt_id, dataset="stdlib-heldout", variant=variant["name"],
        temperature=variant["temperature"], top_k=variant["top_k"], top_p=variant["top_p"],
        sample_index=sample_index, seed=1000 + sample_index, prompt_tokens=12,
        completion_tokens=len(output_ids), spec_verify_ct=rounds,
        tau=(sum(accept_lens) + rounds) / max(rounds, 1), accept_lens=accept_lens,
        expected_accept_lens=[a + 0.25 for a in accept_lens],
        stage_times={"draft": 0.01 * rounds, "tree_build": 0.002 * rounds, "tree_compile": 0.001 * rounds,
                     "verify": 0.02 * rounds, "commit": 0.001 * rounds},
        entropies=[], e2e_latency=decode_time + 0.05, ttft=0.05, decode_time=decode_time, output_ids=output_ids,
        error=None,
    ).to_json()


def throughput_record(tags, concurrency, index, start, end, tokens=16, error=None):
    return ThroughputRecord(
        tags=tags, concurrency=concurrency, request_index=index, prompt_id=f"p{index}", completion_tokens=tokens,
        e2e_latency=end - start, ttft=0.01, tpot=(end - start - 0.01) / (tokens - 1), start_time=start, end_time=end,
        error=error,
    ).to_json()


def make_records():
    rng = np.random.default_rng(1)
    ar = {"profile": "cpu", "pair": "tiny", "method": "ar", "budget": None}
    dd = {"profile": "cpu", "pair": "tiny", "method": "ddtree", "budget": 8}
    acc, thr = [], []
    for p in range(4):
        greedy_out = [p, 1, 2, 3, 4, 5, 6, 7]
        acc.append(acceptance_record(ar, f"p{p}", VARIANTS[0], greedy_out, [0] * 8, decode_time=0.7))
        spec_out = greedy_out if p < 3 else [p, 1, 2, 9, 9, 9, 9, 9]  # one prompt diverges at index 3
        acc.append(acceptance_record(dd, f"p{p}", VARIANTS[0], spec_out, [3, 1, 2], decode_time=0.35))
        for s in range(25):
            acc.append(acceptance_record(ar, f"p{p}", VARIANTS[1], [p] + rng.integers(0, 3, 7).tolist(), [0] * 8,
                                         decode_time=0.7, sample_index=s))
            acc.append(acceptance_record(dd, f"p{p}", VARIANTS[1], [p] + rng.integers(0, 3, 7).tolist(), [2, 0, 1],
                                         decode_time=0.35, sample_index=s))
    for c in (1, 2):
        for i in range(4):
            thr.append(throughput_record(ar, c, i, start=float(i), end=float(i) + 1.0))
            thr.append(throughput_record(dd, c, i, start=float(i), end=float(i) + 0.5))
    thr.append(throughput_record(dd, 2, 4, start=0.0, end=0.1, error="timeout"))
    return acc, thr
