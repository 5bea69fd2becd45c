#!/usr/bin/env bash
# Session 26's second call (after h100_s26_a.sh): the `gpu` pair (train_pair.sh: TRAIN_MINUTES, default 4, with the
# CUDA tests beside it), then the server at 8 concurrent requests, T = 0, 128 new tokens: dflash and ddtree at budgets
# 16, 24 and 32 (24 not measured before; 16 and 32 were within 1% at 8 requests on the H200), two interleaved passes.
#   OUT=$OUT bash benchmarks/engine/h100_s26_b.sh                  (carry .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
source benchmarks/engine/train_pair.sh
left=$(( ${END_S:-585} - SECONDS ))
OUT=/tmp/sweep8 timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods dflash,ddtree --concurrency 8 --budgets 16,24,32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" > /tmp/sweep8.log 2>&1
echo "== sweep rc=$?"; cp /tmp/sweep8/sweep.txt "$OUT/sweep_8.txt" && head -40 "$OUT/sweep_8.txt"
true
