#!/usr/bin/env bash
# Prepared in session 20 for the next GPU session (not yet run: session 21's seven calls and session 22's six were refused
# a machine or lost it mid-run, H100 and H200 alike, so it is still the next GPU session's first call): the engine's CUDA tests with the tree temperature
# (graph == eager and the round kernels, with T = 1 rows among them; session 20's call D ran it under CUDA graphs but
# not these tests), beside a full training of the `gpu` pair; then the engine at batch 1
# (T = 0 and 1, 128 new tokens, two passes) with the tree temperature and with raw trees (`DDTREE_RAW_SAMPLED_TREES=1`),
# for the batch-1 T = 1 target (raw trees: 1.10x / 1.16x dflash in session 20); then the server at 8 requests (T = 0)
# in the time left.
#   OUT=$OUT bash benchmarks/engine/h200_s21_a.sh      (carry .whl)
# With little device time left, the reduced run (a 4-minute training, the tree temperature only, no server):
#   TRAIN_MINUTES=4 SIDES=new END_S=0 OUT=$OUT bash benchmarks/engine/h200_s21_a.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout 300 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py tests/engine/test_triton_attention.py \
    -k "cuda or round_kernels or equals_torch or prefills_beside or split or kernel" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
train_minutes=${TRAIN_MINUTES:-5}
OUT=/tmp/train_out timeout -k 5 $((train_minutes * 60 + 60)) python3 benchmarks/gpu_pair/train_and_eval.py \
    --pair-dir /tmp/gpu-pair --eval-prompts 0 --max-minutes "$train_minutes" > /tmp/train.log 2>&1
echo "train rc=$?"; cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null; cat "$OUT/train.txt"
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
for side in ${SIDES:-new raw}; do
    raw=0; [ $side = raw ] && raw=1
    DDTREE_RAW_SAMPLED_TREES=$raw timeout 80 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
        --num-prompts 12 --max-new-tokens 128 --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --repeats 2 \
        > "$OUT/engine_b1_$side.txt" 2>&1
    echo "== $side rc=$?"; grep -E "^ *(ar|dflash|ddtree) " "$OUT/engine_b1_$side.txt" | tail -8
done
left=$((${END_S:-585} - SECONDS))
[ "$left" -lt 70 ] && { echo "no time left for the server (${left} s)"; exit 0; }
OUT=/tmp/sweep8 timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8 --budgets 32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" > /tmp/sweep8.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep8/sweep.txt "$OUT/sweep_8.txt" && head -12 "$OUT/sweep_8.txt"
true
