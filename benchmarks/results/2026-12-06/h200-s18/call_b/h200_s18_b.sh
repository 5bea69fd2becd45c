#!/usr/bin/env bash
# Session 18, second GPU command (one call: machines were scarce): the prefill beside the rounds (its own stream).
# Beside the `gpu` pair's training (nothing timed while it trains): the CUDA engine tests and the race probe (one
# cross-stream wait dropped: should decode differently). Then, this session's code against the code before it
# (.ab/old: `git archive` of the previous commit's src/ and benchmarks): a request's device cost beyond its rounds
# (`churn_cost.py`), and the server at 8 and 1 concurrent requests (T = 0, 128 new tokens, dflash and ddtree(32)),
# new-old-new-old, one pass each.
#   OUT=$OUT bash benchmarks/engine/h200_s18_b.sh      (carry .whl, .ab, compile_cache.tgz; END_S: seconds to end by, 585)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
(timeout 250 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py -k "cuda or round_kernels or equals_torch or prefills_beside" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt"
 for drop in landed prefilled none; do timeout 40 python3 benchmarks/engine/prefill_race_probe.py --drop $drop 2>&1 \
    | grep "wait dropped"; done > "$OUT/race_probe.txt" 2>&1) &
OUT=/tmp/train_out timeout -k 5 250 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 3.8 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log | tee "$OUT/train.txt"
wait; tail -4 "$OUT/cuda_tests.txt"; cat "$OUT/race_probe.txt"
for side in new old; do
    root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    echo "== $side"
    PYTHONPATH="$root/src" timeout 50 python3 "$root/benchmarks/engine/churn_cost.py" --configs dflash:15,ddtree:32 \
        --new-tokens 20 --prompt-tokens 80 --rounds 400 --top 0 2>&1 | grep -E "new tokens|^ *(dflash|ddtree) +[0-9]"
done 2>&1 | tee "$OUT/churn_ab.txt"
i=0
for side in new old new old; do
    i=$((i + 1)); root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    left=$(((${END_S:-585} - SECONDS) / (5 - i)))
    [ "$left" -lt 45 ] && { echo "== $side (run $i): no time left"; continue; }
    echo "== $side (run $i), ${left} s"
    PYTHONPATH="$root/src:/tmp/site" OUT=/tmp/sweep$i timeout -k 5 $((left + 10)) python3 \
        "$root/benchmarks/gpu_pair/serve_sweep.py" --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8,1 \
        --budgets 32 --max-new-tokens 128 --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 1 \
        --time-budget-s "$left" > /tmp/sweep$i.log 2>&1
    echo "sweep rc=$?"; cp /tmp/sweep$i/sweep.txt "$OUT/sweep_${i}_$side.txt" && head -4 "$OUT/sweep_${i}_$side.txt"
done
