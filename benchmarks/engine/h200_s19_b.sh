#!/usr/bin/env bash
# Its engine change (the prefill stream, own capture stream) was reverted after this call (5b9d1c4); the code it ran is c93c318.
# Session 19, second GPU command (~10 minutes of device time left): call A's CUDA tests failed (8 of 58: graph !=
# eager, even for `ar`): every graph was captured on torch's one default capture stream, so the prefill's GEMMs and
# the round's shared one cuBLAS workspace. Now the prefill's forward is captured on a stream of its own. Beside a
# shorter training (nothing timed while it trains): the same CUDA tests. Then this code against main's (.ab/old): a
# request's device cost beyond its rounds (`churn_cost.py`), and the server at 8 concurrent requests (T = 0, 128 new
# tokens, dflash and ddtree at budgets 16 and 32), new-old-new-old.
#   OUT=$OUT bash benchmarks/engine/h200_s19_b.sh      (carry .ab, .whl, compile_cache.tgz; .ab as in h200_s19_a.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
(timeout 225 python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py \
    tests/engine/test_triton_round.py tests/engine/test_triton_attention.py \
    -k "cuda or round_kernels or equals_torch or prefills_beside or lane or split or kernel" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
OUT=/tmp/train_out timeout -k 5 235 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 2.9 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log | tee "$OUT/train.txt"; tail -3 /tmp/train.log
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
for side in new old; do
    root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    echo "== churn $side"
    PYTHONPATH="$root/src" timeout 40 python3 "$root/benchmarks/engine/churn_cost.py" --configs dflash:15,ddtree:32 \
        --new-tokens 20 --spread 0.5 --prompt-tokens 80 --rounds 300 --top 0 > "$OUT/churn_$side.txt" 2>&1
    grep -E "^ *(dflash|ddtree) +[0-9]" "$OUT/churn_$side.txt"
done
i=0
for side in new old new old; do
    i=$((i + 1)); root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    left=$(((${END_S:-520} - SECONDS) / (5 - i)))
    [ "$left" -lt 35 ] && { echo "== $side (run $i): no time left"; continue; }
    echo "== server $side (run $i), ${left} s"
    PYTHONPATH="$root/src:/tmp/site" OUT=/tmp/sweep$i timeout -k 5 $((left + 8)) python3 \
        "$root/benchmarks/gpu_pair/serve_sweep.py" --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8 \
        --budgets 16,32 --max-new-tokens 128 --min-requests 16 --min-seconds 2 --max-requests 4000 --repeats 1 \
        --time-budget-s "$left" > /tmp/sweep$i.log 2>&1
    echo "sweep rc=$?"; cp /tmp/sweep$i/sweep.txt "$OUT/sweep_${i}_$side.txt" && head -4 "$OUT/sweep_${i}_$side.txt"
    tail -3 /tmp/sweep$i.log
done
