#!/usr/bin/env bash
# Session 23, second call (ran on a5cb0c8 / a93b3ce: main has the same-stream prefill again, so "new" needs that src): the prompt's forward on a side stream beside the round in flight (new) against the
# same-stream prefill (the previous commit's src, carried as .baseline/src), the server at 8 requests on one
# freshly trained `gpu` pair; the engine's CUDA tests on the new code beside the training.
#   git archive HEAD~N src | tar -x -C .baseline   (the old tree; /.baseline/ in .git/info/exclude)
#   OUT=$OUT bash benchmarks/engine/h100_s23_b.sh      (carry .whl and .baseline)
# Third call, after the fix for what the first run of the tests found (cuBLAS workspace and split tickets shared):
#   TRAIN_MINUTES=3 TREES=new END_S=420 OUT=$OUT bash benchmarks/engine/h100_s23_b.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout 280 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py tests/engine/test_triton_attention.py \
    -k "cuda or round_kernels or equals_torch or prefills_beside or split or kernel or prefill" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
train_minutes=${TRAIN_MINUTES:-4}
OUT=/tmp/train_out timeout -k 5 $((train_minutes * 60 + 60)) python3 benchmarks/gpu_pair/train_and_eval.py \
    --pair-dir /tmp/gpu-pair --eval-prompts 0 --max-minutes "$train_minutes" > /tmp/train.log 2>&1
echo "train rc=$?"; cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null; cat "$OUT/train.txt"
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
trees=${TREES:-new old}
for tree in $trees; do
    left=$((${END_S:-580} - SECONDS)); [ "$trees" != new ] && [ $tree = new ] && left=$((left / 2))
    [ "$left" -lt 60 ] && { echo "no time left for $tree (${left} s)"; continue; }
    src=$PWD/src; [ $tree = old ] && src=$PWD/.baseline/src
    PYTHONPATH="$src:/tmp/site" OUT=/tmp/sweep_$tree timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py \
        --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8 --budgets 32 --max-new-tokens 128 \
        --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" \
        > /tmp/sweep_$tree.log 2>&1
    echo "== sweep $tree rc=$?"; cp /tmp/sweep_$tree/sweep.txt "$OUT/sweep_8_$tree.txt" && head -40 "$OUT/sweep_8_$tree.txt"
done
true
