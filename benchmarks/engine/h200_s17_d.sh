#!/usr/bin/env bash
# Session 17, fourth H200 command: a request's device cost beyond its rounds (prefill, first token, retirement) in a
# batch of 8 with requests coming and going, per method (`churn_cost.py`), with the top kernels of the churn rounds;
# then the Qwen3-8B shape at batch 8.
#   OUT=$OUT bash benchmarks/engine/h200_s17_d.sh      (carry compile_cache.tgz if this checkout has one)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
timeout 300 python3 benchmarks/engine/churn_cost.py --configs dflash:15,ddtree:16,ddtree:32 --new-tokens 20,10 \
    --prompt-tokens 80 --rounds 400 --top 25 2>&1 | tee "$OUT/churn_cost.txt"
echo "churn cost rc=$?"
# the same rounds at an 8B target's cost (weights streamed once a round): what a ddtree round costs against
# dflash's at batch 8 where the round is not bound by its launches
timeout 250 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --methods ar,dflash,ddtree --budgets 16,32,64 \
    --batch-sizes 8 --rounds 30 --json-out "$OUT/cost_8b.json" > "$OUT/cost_8b.txt" 2>&1
echo "8B cost model rc=$?"; tail -8 "$OUT/cost_8b.txt"
