#!/usr/bin/env bash
# Session 24, with little device time left (no training): a request's cost beyond its rounds (`churn_cost.py`) and the device's idle (`device_gaps.py`) at depths 1 and 2
# with requests of 32-96 new tokens (random weights decode one token a round, so every request of a batch is rarely
# within the rounds in flight of its end at once, as in the server; at 10-30 tokens the loop drains almost every step), then the
# CUDA tests of the overlapped schedule at depths 1 and 2, then the idle stretches.
#   OUT=$OUT bash benchmarks/engine/h100_s24_d.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
for depth in 1 2; do
    DDTREE_OVERLAP_DEPTH=$depth timeout 60 python3 benchmarks/engine/churn_cost.py --configs dflash:15,ddtree:32 \
        --new-tokens 64 --spread 0.5 --prompt-tokens 80 --rounds 1500 --top 0 > "$OUT/churn64_depth$depth.txt" 2>&1
    echo "churn depth $depth rc=$?"; grep -E "new tokens" "$OUT/churn64_depth$depth.txt"
done
timeout ${TESTS_S:-100} python3 -m pytest -q tests/engine/test_batched.py -k "overlapped_rounds_equal and cuda" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt"
grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
for depth in 2 1; do
    DDTREE_OVERLAP_DEPTH=$depth timeout 45 python3 benchmarks/engine/device_gaps.py --configs dflash:15,ddtree:32 \
        --new-tokens 64 --rounds 300 > "$OUT/gaps64_depth$depth.txt" 2>&1
    echo "gaps depth $depth rc=$?"; grep -E "^(dflash|ddtree)" "$OUT/gaps64_depth$depth.txt" | cut -c1-330
done
true
