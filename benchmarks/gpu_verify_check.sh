#!/usr/bin/env bash
# Verify check on one GPU (issue 2's last verify target: sampling verify <= 1.2x greedy verify at B 64, budget 128).
#
#   PYTHONPATH=/tmp/site:src OUT=/some/dir benchmarks/gpu_verify_check.sh      # H200, < 3 minutes
#   PYTHONPATH=/tmp/tritonlib:src benchmarks/gpu_verify_check.sh --smoke       # CPU, Triton interpreter, tiny
#
# Steps (each under its own time limit; the script goes on after a failure and exits 1 if any step failed):
#   1. pytest tests/core/test_kernels.py tests/core/test_verify.py (the Triton tests run on CUDA; in --smoke
#      only the fast lazy-walk tests under the interpreter).
#   2. timing: B in {1, 64} x budget in {32, 128}, V = 151,936, D = 15, bf16 target logits [B, budget + 1, V]:
#      greedy verify vs sampling verify (T = 1, backend "triton": the lazy walk) vs the previous fused path
#      (inverse-CDF row sampler, lazy walk switched off), CUDA events, median of 20 after 5 warm-up calls,
#      on "random" logits (randn * 3, as `ddtree bench core`) and "peaked" logits (randn * 3 plus PEAK at
#      [parent row, token of the parent's best child] for every node, so greedy and sampling walk deep).
#      Also the pieces: one-read lse+min kernel, walk kernel, check_all_finite, argmax.
#      Prints both tables; JSON in $OUT/verify_check.json; logs in $OUT/*.log.
set -u
cd "$(dirname "$0")/.."
. benchmarks/check_common.sh
check_setup /tmp/ddtree_verify_check "${1:-}"
if [ "$SMOKE" = 1 ]; then
    PYTEST_ARGS=(tests/core/test_kernels.py -k "lazy and not lossless")
    LIMITS=(300 300)
else
    PYTEST_ARGS=(tests/core/test_kernels.py tests/core/test_verify.py)
    LIMITS=(100 75)
fi

step pytest "${LIMITS[0]}" $PY -m pytest -q -x "${PYTEST_ARGS[@]}"

cat > "$OUT/verify_timing.py" <<'PYEOF'
"""Greedy vs sampling verify timing (see gpu_verify_check.sh)."""
import json
import os
import statistics
import time

import torch

import ddtree.core.kernels as kernels
from ddtree.core.build import build_tree
from ddtree.core.checks import check_all_finite
from ddtree.core.sampling import SamplingParams
from ddtree.core.verify import resolve_backend, verify_greedy, verify_sampling

SMOKE = os.environ.get("SMOKE") == "1"
DEVICE = torch.device("cpu" if SMOKE else "cuda")
VOCAB, DEPTH = (64, 3) if SMOKE else (151_936, 15)
BATCHES, BUDGETS = ((1, 2), (4,)) if SMOKE else ((1, 64), (32, 128))
REPS, WARMUP = (2, 1) if SMOKE else (20, 5)
PEAK = 30.0  # randn * 3 has row max ~13.5 over V = 151,936 and log-sum-exp ~16.4: +30 makes the child dominant


def median_ms(fn) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPS):
        if DEVICE.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peaked(tree, target):
    """Add PEAK at [b, parent, token of the parent's best child] (best child = smallest column: best-first)."""
    batch, cols, vocab = target.shape
    col = torch.arange(cols, device=DEVICE).expand(batch, cols)
    real = tree.parents >= 0
    parent = torch.where(real, tree.parents, cols)  # padding/root -> a spare slot
    best = torch.full((batch, cols + 1), cols, dtype=torch.int64, device=DEVICE)
    best.scatter_reduce_(1, parent, col, reduce="amin")
    best = best[:, :cols]  # [B, N]: best child of each node (cols = none)
    has = best < cols
    tok = tree.token_ids.gather(1, best.clamp_max(cols - 1))  # [B, N]
    out = target.clone()
    flat = out.view(batch, cols * vocab)
    index = (col * vocab + tok.clamp_min(0))[has].view(-1)
    rows = torch.arange(batch, device=DEVICE).unsqueeze(1).expand(batch, cols)[has]
    flat[rows, index] += PEAK
    return out


def cdf_only(fn):
    saved = kernels.lazy_walk_usable
    kernels.lazy_walk_usable = lambda device: False
    try:
        return fn()
    finally:
        kernels.lazy_walk_usable = saved


def main():
    params = SamplingParams(1.0, -1, 1.0)
    info = {"device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "vocab": VOCAB, "depth": DEPTH, "reps": REPS, "warmup": WARMUP,
            "lazy_walk_usable": kernels.lazy_walk_usable(DEVICE), "cdf_sampler_usable": kernels.cdf_sampler_usable(DEVICE),
            "auto_backend": resolve_backend("auto", DEVICE, params)}
    info["probe_errors"] = dict(kernels.TRITON_PROBE_ERRORS)
    print(json.dumps(info))
    rows = []
    for batch in BATCHES:
        for budget in BUDGETS:
            gen = torch.Generator(device=DEVICE).manual_seed(batch * 1000 + budget)
            draft = (torch.randn((batch, DEPTH, VOCAB), generator=gen, device=DEVICE) * 3).to(torch.bfloat16)
            tree = build_tree(draft, budget, method="batched")
            del draft
            base = (torch.randn((batch, budget + 1, VOCAB), generator=gen, device=DEVICE) * 3).to(torch.bfloat16)
            for kind in ("random", "peaked"):
                target = base if kind == "random" else peaked(tree, base)
                vgen = torch.Generator(device=DEVICE).manual_seed(7)
                row = {"batch": batch, "budget": budget, "logits": kind}
                g = lambda: verify_greedy(tree, target, max_depth=DEPTH)  # noqa: E731
                s = lambda: verify_sampling(tree, target, params, vgen, max_depth=DEPTH, backend="triton")  # noqa: E731
                row["greedy_ms"] = median_ms(g)
                row["sampling_ms"] = median_ms(s)
                row["sampling_cdf_ms"] = cdf_only(lambda: median_ms(s))
                row["ratio"] = row["sampling_ms"] / row["greedy_ms"]
                row["ratio_cdf"] = row["sampling_cdf_ms"] / row["greedy_ms"]
                # pieces
                b, n = tree.token_ids.shape
                inv_t = torch.ones(b, device=DEVICE)
                lse, _ = kernels.scaled_row_lse_and_min(target, inv_t)
                uni = torch.rand((b, DEPTH + 1), generator=vgen, device=DEVICE)
                noisy = torch.ones(b, dtype=torch.bool, device=DEVICE)
                row["piece_lse_min_ms"] = median_ms(lambda: kernels.scaled_row_lse_and_min(target, inv_t))
                for blk in (1024, 4096):  # the default is 2048: is another block size faster on this GPU?
                    row[f"piece_lse_min_block{blk}_ms"] = median_ms(
                        lambda: kernels.scaled_row_lse_and_min(target, inv_t, block=blk))
                row["piece_walk_ms"] = median_ms(lambda: kernels.lazy_walk(
                    target, lse, tree.parents, tree.token_ids, inv_t, noisy, uni, DEPTH))
                row["piece_check_all_finite_ms"] = median_ms(lambda: check_all_finite("x", target))
                row["piece_argmax_ms"] = median_ms(lambda: target.argmax(-1))
                sampled = s()
                row["mean_accept_len_sampling"] = float(sampled.accept_len.float().mean())
                row["mean_expected_accept_len"] = float(sampled.expected_accept_len.mean())
                row["mean_accept_len_greedy"] = float(g().accept_len.float().mean())
                rows.append(row)
                print(json.dumps(row), flush=True)
                if kind == "peaked":
                    del target
            del base, tree
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()
    for kind in ("random", "peaked"):
        print(f"\n{kind} logits (ms, median of {REPS}); ratio = sampling / greedy (target <= 1.20 at B 64, budget 128)")
        print(f"{'B':>3} {'budget':>6} {'greedy':>8} {'sampling':>9} {'ratio':>6} {'old cdf':>8} {'ratio':>6} "
              f"{'lse+min':>8} {'walk':>7} {'finite':>7} {'argmax':>7} {'acc_s':>6} {'E[acc]':>6} {'acc_g':>6}")
        for r in rows:
            if r["logits"] == kind:
                print(f"{r['batch']:>3} {r['budget']:>6} {r['greedy_ms']:8.3f} {r['sampling_ms']:9.3f} {r['ratio']:6.2f} "
                      f"{r['sampling_cdf_ms']:8.3f} {r['ratio_cdf']:6.2f} {r['piece_lse_min_ms']:8.3f} "
                      f"{r['piece_walk_ms']:7.3f} {r['piece_check_all_finite_ms']:7.3f} {r['piece_argmax_ms']:7.3f} "
                      f"{r['mean_accept_len_sampling']:6.2f} {r['mean_expected_accept_len']:6.2f} "
                      f"{r['mean_accept_len_greedy']:6.2f}")
    with open(os.path.join(os.environ["OUT"], "verify_check.json"), "w") as fh:
        json.dump({"info": info, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
PYEOF

step timing "${LIMITS[1]}" $PY "$OUT/verify_timing.py"
echo "=== done: status=$status, JSON in $OUT/verify_check.json"
exit $status
