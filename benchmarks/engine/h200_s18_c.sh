#!/usr/bin/env bash
# Session 18, third GPU command, for the machine h200_s18_b.sh left warm (its pair in /tmp/gpu-pair): the server at 8
# and 1 concurrent requests (T = 0, 128 new tokens, budgets 16 and 32), this session's code and the code before it
# (.ab/old) in turn, new-old-new-old, one pass each.
#   OUT=$OUT bash benchmarks/engine/h200_s18_c.sh      (carry .whl, .ab, compile_cache.tgz)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
[ -f /tmp/gpu-pair/manifest.json ] || { echo "no pair in /tmp/gpu-pair: run h200_s18_b.sh first"; exit 1; }
i=0
for side in new old new old; do
    i=$((i + 1)); root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    echo "== $side (run $i)"
    PYTHONPATH="$root/src:/tmp/site" OUT=/tmp/sweep$i timeout -k 10 $((480 - SECONDS)) python3 \
        "$root/benchmarks/gpu_pair/serve_sweep.py" --pair /tmp/gpu-pair --methods ar,dflash,ddtree --concurrency 8,1 \
        --budgets 16,32 --max-new-tokens 128 --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 1 \
        --time-budget-s $(((470 - SECONDS) / (5 - i))) > /tmp/sweep$i.log 2>&1
    echo "sweep rc=$?"; cp /tmp/sweep$i/sweep.txt "$OUT/sweep_${i}_$side.txt"; head -4 "$OUT/sweep_${i}_$side.txt"
done
