#!/usr/bin/env bash
# Session 19, second GPU command, on the machine call A left warm (A's pair in /tmp/gpu-pair, the server's wheels in
# /tmp/site): the server at 8 and 1 concurrent requests (T = 0, 128 new tokens, dflash and ddtree at budgets 16 and
# 32), this session's code against main's (.ab/old), new-old-new-old, one pass each.
#   OUT=$OUT bash benchmarks/engine/h200_s19_b.sh      (carry .ab, .whl, compile_cache.tgz; END_S: seconds to end by, 585)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
[ -d /tmp/gpu-pair ] || { echo "no pair in /tmp/gpu-pair: run call A first"; exit 2; }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
i=0
for side in new old new old; do
    i=$((i + 1)); root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    left=$(((${END_S:-585} - SECONDS) / (5 - i)))
    [ "$left" -lt 45 ] && { echo "== $side (run $i): no time left"; continue; }
    echo "== $side (run $i), ${left} s"
    PYTHONPATH="$root/src:/tmp/site" OUT=/tmp/sweep$i timeout -k 5 $((left + 10)) python3 \
        "$root/benchmarks/gpu_pair/serve_sweep.py" --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8,1 \
        --budgets 16,32 --max-new-tokens 128 --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 1 \
        --time-budget-s "$left" > /tmp/sweep$i.log 2>&1
    echo "sweep rc=$?"; cp /tmp/sweep$i/sweep.txt "$OUT/sweep_${i}_$side.txt" && head -6 "$OUT/sweep_${i}_$side.txt"
done
