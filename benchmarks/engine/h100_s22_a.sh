#!/usr/bin/env bash
# Session 22's reduced first call (only ~500 s of device time were left after refusals and one machine taken back
# mid-run): the engine's CUDA tests with the tree temperature (never run on a GPU before) beside a shorter `gpu` pair
# training (4 min, not 5), then the engine at batch 1 (T = 0 and 1, 128 new tokens) with the tree temperature only.
# No server sweep. The full version is h200_s21_a.sh. Not run either: the session's device time ran out on refusals.
#   OUT=$OUT bash benchmarks/engine/h100_s22_a.sh      (carry .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout 280 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py tests/engine/test_triton_attention.py \
    -k "cuda or round_kernels or equals_torch or prefills_beside or split or kernel" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
OUT=/tmp/train_out timeout -k 5 290 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 4.0 > /tmp/train.log 2>&1
echo "train rc=$?"; cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null; cat "$OUT/train.txt"
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
timeout 90 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
    --num-prompts 12 --max-new-tokens 128 --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --repeats 2 \
    > "$OUT/engine_b1_new.txt" 2>&1
echo "== engine rc=$?"; grep -E "^ *(ar|dflash|ddtree) " "$OUT/engine_b1_new.txt" | tail -8
true
