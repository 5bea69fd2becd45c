#!/usr/bin/env bash
# Session 17, second H200 command, meant for the machine h200_s17_a.sh left warm (its pair in /tmp/gpu-pair, its
# compile caches in /tmp/compile_cache; a bare machine trains the pair first and sweeps less): the server at 8 and
# 1 concurrent requests in two passes (the order of the methods rotated between them), 128 new tokens, then 8
# requests of 512 new tokens (a request's fixed costs, HTTP and admission, spread over 4x the tokens).
#   OUT=$OUT bash benchmarks/engine/h200_s17_b.sh      (carry .whl; and compile_cache.tgz if this checkout has one)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
long_s=250
if [ -f /tmp/gpu-pair/manifest.json ]; then
    echo "the pair of the call before: $(grep -E 'held-out' /tmp/train.log | head -1)"
else
    echo "bare machine: training the pair first"; long_s=0
    OUT=/tmp/train_out timeout -k 5 315 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
        --eval-prompts 0 --max-minutes 5.0 > /tmp/train.log 2>&1
    echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log
fi
OUT=/tmp/sweep2 timeout -k 10 $((560 - long_s - ${SECONDS})) python3 benchmarks/gpu_pair/serve_sweep.py \
    --pair /tmp/gpu-pair --methods ar,dflash,ddtree --concurrency 8,1 --budgets 16,32 --max-new-tokens 128 \
    --min-requests 16 --min-seconds 4 --max-requests 4000 --repeats 2 --time-budget-s $((545 - long_s - ${SECONDS})) \
    > /tmp/sweep2.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep2/sweep.txt "$OUT/sweep_128.txt"; gzip -c /tmp/sweep2/sweep.json > "$OUT/sweep_128.json.gz"
cat "$OUT/sweep_128.txt"
if [ "$long_s" -gt 0 ]; then
    OUT=/tmp/sweep3 timeout -k 10 $((585 - SECONDS)) python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
        --methods ar,dflash,ddtree --concurrency 8 --budgets 32,64 --max-new-tokens 512 --min-requests 16 \
        --min-seconds 4 --max-requests 4000 --repeats 1 --time-budget-s $((570 - SECONDS)) > /tmp/sweep3.log 2>&1
    echo "sweep rc=$?"; cp /tmp/sweep3/sweep.txt "$OUT/sweep_512.txt"; gzip -c /tmp/sweep3/sweep.json > "$OUT/sweep_512.json.gz"
    cat "$OUT/sweep_512.txt"
fi
