#!/usr/bin/env bash
# Session 16, the server with its engine in a process of its own (`ddtree.server.engine_process`), one H200 command:
# the CUDA tests of the scheduler and batched engine beside the full pair's training, then the server sweep at 8, 1,
# 2, 4 and 16 concurrent requests (ar, dflash, ddtree at budgets 16 and 32) with each level's request timeline.
# Call A of the session (`h200_s16_a.sh`) measured the same recipe with the engine in the server's process.
#   OUT=$OUT bash benchmarks/engine/h200_s16_b.sh      (carry .whl and .triton_cache.tgz)
# Fits the 600 s a command may run: training ~290 s (the tests beside it 150 s at most), the sweep 255 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .triton_cache "$OUT"
[ -f .triton_cache.tgz ] && tar xzf .triton_cache.tgz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
(timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/test_scheduler.py tests/engine/test_batched.py \
    -k "cuda or equals_torch" > "$OUT/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/tests.txt") &
OUT=/tmp/train_out timeout -k 5 330 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes 5.3 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log
wait; tail -3 "$OUT/tests.txt"
OUT=/tmp/sweep timeout -k 10 265 python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8,1,2,4,16 --budgets 16,32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 1 --time-budget-s 255 > /tmp/sweep.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep/sweep.txt "$OUT/sweep.txt"; gzip -c /tmp/sweep/sweep.json > "$OUT/sweep.json.gz"
tail -c 20000 /tmp/sweep/server_ddtree.log > "$OUT/server_ddtree_tail.log"
cat "$OUT/sweep.txt"
