#!/usr/bin/env bash
# Session 16's last H200 command: the engine process's pipe read and written by the server's event loop (no threads
# in the server process beside it; call B's receiving thread waited on the GIL under load and the served rate fell
# from 8 to 16 concurrent requests). The full pair's training, then the server sweep at 16, 8, 1, 2 and 4 requests.
#   OUT=$OUT bash benchmarks/engine/h200_s16_c.sh      (carry .whl and .triton_cache.tgz)
# Sized for the ~10 minutes of device time left: training ~275 s, the sweep 190 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .triton_cache "$OUT"
[ -f .triton_cache.tgz ] && tar xzf .triton_cache.tgz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
OUT=/tmp/train_out timeout -k 5 330 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes 5.3 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log
OUT=/tmp/sweep timeout -k 10 200 python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 16,8,1,2,4 --budgets 16,32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 1 --time-budget-s 190 > /tmp/sweep.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep/sweep.txt "$OUT/sweep.txt"; gzip -c /tmp/sweep/sweep.json > "$OUT/sweep.json.gz"
tail -c 20000 /tmp/sweep/server_ddtree.log > "$OUT/server_ddtree_tail.log"
cat "$OUT/sweep.txt"
