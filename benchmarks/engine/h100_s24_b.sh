#!/usr/bin/env bash
# Session 24, second call: two rounds in flight (DDTREE_OVERLAP_DEPTH=2) against one (main's default) through the
# server at 8 requests on one freshly trained `gpu` pair (T = 0, budget 32, 128 new tokens, two interleaved passes a
# depth, depth 1 first); the engine's CUDA tests (depths 1 and 2) beside the training.
#   OUT=$OUT bash benchmarks/engine/h100_s24_b.sh      (carry .whl)
# With one call's device time left (a 3-minute training, batch 1 at both depths after the sweeps):
#   TRAIN_MINUTES=3 END_S=470 B1_DEPTHS="2 1" OUT=$OUT bash benchmarks/engine/h100_s24_b.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout ${TESTS_S:-280} python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py -k "cuda" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
train_minutes=${TRAIN_MINUTES:-4}
OUT=/tmp/train_out timeout -k 5 $((train_minutes * 60 + 60)) python3 benchmarks/gpu_pair/train_and_eval.py \
    --pair-dir /tmp/gpu-pair --eval-prompts 0 --max-minutes "$train_minutes" > /tmp/train.log 2>&1
echo "train rc=$?"; cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null; cat "$OUT/train.txt"
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
depths=${DEPTHS:-1 2}
n=$(echo $depths | wc -w); i=0
for depth in $depths; do
    left=$(( (${END_S:-585} - SECONDS) / (n - i) )); i=$((i + 1))
    [ "$left" -lt 60 ] && { echo "no time left for depth $depth (${left} s)"; continue; }
    DDTREE_OVERLAP_DEPTH=$depth OUT=/tmp/sweep_d$depth timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py \
        --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8 --budgets 32 --max-new-tokens 128 \
        --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" \
        > /tmp/sweep_d$depth.log 2>&1
    echo "== sweep depth $depth rc=$?"; cp /tmp/sweep_d$depth/sweep.txt "$OUT/sweep_8_depth$depth.txt" && head -40 "$OUT/sweep_8_depth$depth.txt"
done
for depth in ${B1_DEPTHS:-}; do  # batch 1, when END_S leaves room after the sweeps (h100_s24_c.sh runs it otherwise)
    left=$((${B1_END_S:-590} - SECONDS)); [ "$left" -lt 30 ] && { echo "no time left for batch 1 depth $depth"; continue; }
    DDTREE_OVERLAP_DEPTH=$depth timeout "$left" python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
        --num-prompts 8 --max-new-tokens 128 --budgets 32,64,128 --temperatures 0 --warmup-seconds 3 --repeats 2 \
        > "$OUT/engine_b1_depth$depth.txt" 2>&1
    echo "== batch 1 depth $depth rc=$?"; grep -E "^ *(ar|dflash|ddtree) " "$OUT/engine_b1_depth$depth.txt" | tail -8
done
true
