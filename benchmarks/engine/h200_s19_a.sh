#!/usr/bin/env bash
# Its engine change (the prefill stream) was reverted after this call (5b9d1c4); the code it ran is 3aedf73.
# Session 19, first GPU command (machine starts were being refused: everything in one call): the staged prefill on a
# stream of its own with split-attention tickets of its own (`triton_attention.counter_lane`), and the draft's lm_head
# over the whole block.
# Beside the `gpu` pair's training (nothing timed while it trains): the CUDA tests of the engine, the scheduler, the
# round kernels and the attention kernel. Then this session's code against main's (.ab/old): a request's device cost
# beyond its rounds (`churn_cost.py`, requests of 10-30 tokens); the server at 8 concurrent requests (T = 0, 128 new
# tokens, dflash and ddtree at budgets 16 and 32), new-old-new-old; the Qwen3-8B shape's dflash and ddtree(32) rounds
# at batch 8 (the lm_head change) in the time left. The compile caches come back as compile_cache.tgz.
# Set up here with `mkdir -p .ab/old && git archive HEAD src benchmarks/engine benchmarks/gpu_pair | tar x -C .ab/old`
# (HEAD: main before the change), then
#   OUT=$OUT bash benchmarks/engine/h200_s19_a.sh      (carry .ab, .whl, compile_cache.tgz)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
python3 benchmarks/versions.py 2>&1 | tee "$OUT/versions.txt"
(timeout 220 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py tests/engine/test_triton_attention.py \
    -k "cuda or round_kernels or equals_torch or prefills_beside or lane or split or kernel" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
OUT=/tmp/train_out timeout -k 5 225 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 3.4 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log | tee "$OUT/train.txt"
wait; tail -4 "$OUT/cuda_tests.txt"
for side in new old; do
    root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    echo "== churn $side"
    PYTHONPATH="$root/src" timeout 45 python3 "$root/benchmarks/engine/churn_cost.py" --configs dflash:15,ddtree:32 \
        --new-tokens 20 --spread 0.5 --prompt-tokens 80 --rounds 300 --top 0 > "$OUT/churn_$side.txt" 2>&1
    grep -E "new tokens|^ *(dflash|ddtree) +[0-9]" "$OUT/churn_$side.txt"
done
tar czf /tmp/compile_cache.tgz -C /tmp/compile_cache . && size=$(stat -c %s /tmp/compile_cache.tgz) && echo "compile cache $size bytes"
[ "${size:-0}" -lt 16000000 ] && cp /tmp/compile_cache.tgz "$OUT/compile_cache.tgz"
i=0
for side in new old new old; do
    i=$((i + 1)); root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    left=$(((${END_S:-530} - SECONDS) / (5 - i)))
    [ "$left" -lt 40 ] && { echo "== $side (run $i): no time left"; continue; }
    echo "== server $side (run $i), ${left} s"
    PYTHONPATH="$root/src:/tmp/site" OUT=/tmp/sweep$i timeout -k 5 $((left + 8)) python3 \
        "$root/benchmarks/gpu_pair/serve_sweep.py" --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8 \
        --budgets 16,32 --max-new-tokens 128 --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 1 \
        --time-budget-s "$left" > /tmp/sweep$i.log 2>&1
    echo "sweep rc=$?"; cp /tmp/sweep$i/sweep.txt "$OUT/sweep_${i}_$side.txt" && head -6 "$OUT/sweep_${i}_$side.txt"
done
for side in new old; do
    root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    left=$(((592 - SECONDS) / 2)); [ $side = old ] && left=$((590 - SECONDS))
    [ "$left" -lt 25 ] && { echo "== 8B $side: no time left"; continue; }
    echo "== 8B $side, ${left} s"
    PYTHONPATH="$root/src" timeout "$left" python3 -m ddtree.cli bench engine --random-weights qwen3-8b \
        --methods dflash,ddtree --budgets 32 --batch-sizes 8 --rounds 15 > "$OUT/lm_head_$side.txt" 2>&1
    grep -E "^triton B=" "$OUT/lm_head_$side.txt"
done
