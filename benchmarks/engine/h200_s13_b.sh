#!/usr/bin/env bash
# Second H200 command of a session (warm machine, the pair trained by h200_s15_a.sh in /tmp/gpu-pair):
# the server at 8 and 1 requests with overlapped rounds (the default), then the same without (DDTREE_NO_OVERLAP=1),
# each ~4.5 minutes, with the decoding loop's phases per level (budget 16 added in session 14: the best budget
# shrinks as the batch grows).
#   OUT=$OUT bash benchmarks/engine/h200_s13_b.sh      (carry .triton_cache.tgz, .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xzf .triton_cache.tgz 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
for mode in overlap sync; do
    [ "$mode" = sync ] && export DDTREE_NO_OVERLAP=1
    OUT="/tmp/sweep_$mode" timeout -k 10 280 python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
        --methods ar,dflash,ddtree --concurrency 8,1 --budgets 16,32,64 --max-new-tokens 128 --min-requests 16 \
        --min-seconds 4 --repeats 1 --time-budget-s 265 > "/tmp/sweep_$mode.log" 2>&1
    echo "sweep $mode rc=$?"; cp "/tmp/sweep_$mode/sweep.txt" "$OUT/sweep_$mode.txt"
    gzip -c "/tmp/sweep_$mode/sweep.json" > "$OUT/sweep_$mode.json.gz"; cat "$OUT/sweep_$mode.txt"
done
