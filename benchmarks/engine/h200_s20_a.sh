#!/usr/bin/env bash
# Session 20, first GPU command: the final code of issue 12 (main at the start of session 20: session 19's draft
# lm_head over the whole block, nothing else changed) on the GPU as a whole. Beside the `gpu` pair's full training
# (nothing timed while it trains): the CUDA tests of the engine, the scheduler, the round kernels and the attention
# kernel (they also fill the compile caches the servers read). Then the pair's teacher-forced taus on 16 held-out
# prompts, and the server at 8 concurrent requests (T = 0, 128 new tokens; ar, dflash, ddtree at budgets 16 and 32)
# in as many passes as the time left allows. The pair stays in /tmp/gpu-pair for call B on the warm machine.
#   OUT=$OUT bash benchmarks/engine/h200_s20_a.sh      (carry .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
python3 benchmarks/versions.py 2>&1 | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$OUT/versions.txt"
(timeout 300 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py tests/engine/test_triton_attention.py \
    -k "cuda or round_kernels or equals_torch or prefills_beside or split or kernel" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
OUT=/tmp/train_out timeout -k 5 360 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 16 --budgets 16,32,64 --max-minutes 5.0 --eval-deadline-s 330 > /tmp/train.log 2>&1
echo "train rc=$?"
cat /tmp/train_out/table.txt | tee "$OUT/train.txt"; tail -3 /tmp/train.log
cp /tmp/train_out/status.json "$OUT/train_status.json" 2>/dev/null
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
left=$((${END_S:-585} - SECONDS))
echo "== server at 8 requests, ${left} s"
OUT=/tmp/sweep8 timeout -k 5 $((left + 5)) python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8 --budgets 16,32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 4 --time-budget-s "$((left - 5))" > /tmp/sweep8.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep8/sweep.txt "$OUT/sweep_8.txt" && cat "$OUT/sweep_8.txt"
tail -3 /tmp/sweep8.log
true
