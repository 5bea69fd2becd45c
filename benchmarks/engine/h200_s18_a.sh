#!/usr/bin/env bash
# Session 18, first GPU command (it ran on an H100): session 17's call D (never ran) on a fresh machine: a
# request's device cost beyond its rounds (prefill, first token, retirement) at batch 8 with requests coming and going
# (`churn_cost.py`, every request of a wave the same length as it ran then: --spread 0; with the churn rounds' top
# kernels), then the Qwen3-8B shape at batch 8; the compile caches come back as compile_cache.tgz.
#   OUT=$OUT bash benchmarks/engine/h200_s18_a.sh      (carry compile_cache.tgz if this checkout has one)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
timeout 330 python3 benchmarks/engine/churn_cost.py --configs dflash:15,ddtree:16,ddtree:32 --new-tokens 20,10 --spread 0 \
    --prompt-tokens 80 --rounds 400 --top 25 2>&1 | tee "$OUT/churn_cost.txt"
echo "churn cost rc=$?"
tar czf /tmp/compile_cache.tgz -C /tmp/compile_cache . && size=$(stat -c %s /tmp/compile_cache.tgz) && echo "compile cache $size bytes"
[ "${size:-0}" -lt 16000000 ] && cp /tmp/compile_cache.tgz "$OUT/compile_cache.tgz"
timeout 220 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --methods ar,dflash,ddtree --budgets 16,32,64 \
    --batch-sizes 8 --rounds 30 --json-out "$OUT/cost_8b.json" > "$OUT/cost_8b.txt" 2>&1
echo "8B cost model rc=$?"; tail -8 "$OUT/cost_8b.txt"
