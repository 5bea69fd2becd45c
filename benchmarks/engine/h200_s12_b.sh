#!/usr/bin/env bash
# Session 12's second H200 command (issue 12): the round's tree compile and greedy walk as one Triton launch each
# (`ddtree.engine.triton_round`). CUDA tests beside the pair's training; then the pair in the engine at batch 1
# (T = 0 and 1), the pair's shape and the 8B shape in the cost model (random weights: stage costs against call 2 of
# this session and session 11), and the server at 8 requests with what time is left.
#   tar xzf .triton_cache.tgz; OUT=$OUT bash benchmarks/engine/h200_s12_b.sh      (carry .triton_cache.tgz, .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
export PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
(timeout 280 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_round.py \
    tests/engine/test_batched.py -k "cuda or round_kernels or equals_torch" > "$OUT/tests.txt" 2>&1
 echo "tests rc=$?" >> "$OUT/tests.txt") &
timeout -k 5 340 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes 6 > "$OUT/train.log" 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" "$OUT/train.log"
wait
tail -2 "$OUT/tests.txt"
timeout -k 5 100 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 16 --max-new-tokens 128 \
    --budgets 32,64,128 --temperatures 0,1 --warmup-seconds 5 --no-progress --json-out "$OUT/pair_engine.json" \
    > "$OUT/pair_engine.txt" 2>&1
echo "engine rc=$?"; grep -E "^ *(method|ar|dflash|ddtree) " "$OUT/pair_engine.txt"
timeout -k 5 80 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 64 --batch-sizes 1 \
    --rounds 30 --tau 6.58,10.73 --json-out "$OUT/cost_8b.json" > "$OUT/cost_8b.txt" 2>&1
echo "cost 8b rc=$?"; grep -E "^triton" "$OUT/cost_8b.txt"
timeout -k 5 60 python3 -m ddtree.cli bench engine --random-weights gpu-pair --budgets 16,64 --batch-sizes 1,8 \
    --rounds 40 --json-out "$OUT/cost_pair.json" > "$OUT/cost_pair.txt" 2>&1
echo "cost pair rc=$?"; grep -E "^triton" "$OUT/cost_pair.txt"
left=$(( 585 - ($(date +%s) - start) ))
if [ "$left" -gt 90 ]; then
    if ls .whl/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH="$PYTHONPATH:/tmp/site"
    fi
    OUT="$OUT/sweep" timeout -k 10 "$left" python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
        --methods ar,dflash,ddtree --concurrency 8 --budgets 32,64 --max-new-tokens 128 --min-requests 16 \
        --min-seconds 4 --repeats 1 --time-budget-s "$((left - 10))" > "$OUT/sweep.log" 2>&1
    echo "sweep rc=$?"; head -6 "$OUT/sweep/sweep.txt"; tail -8 "$OUT/sweep/sweep.txt"
fi
gzip -f "$OUT/train.log" "$OUT"/sweep/*.jsonl 2>/dev/null
