#!/usr/bin/env bash
# One 10-minute H200 command: train the `gpu` pair into /tmp/gpu-pair, time it in the engine (batch 1, T = 0 and 1,
# one pass), then the server's throughput against concurrency for ddtree / dflash / ar (issue 12), ending on its
# own time budget (the cheap methods first, so a short budget still has every ratio). Carry [".whl", ".triton_cache"]: the server wheels (fetch_server_wheels.sh) and, when an earlier
# call brought it back, the Triton cache, so the servers start without compiling (a cold ddtree server took 210 s).
#   OUT=/tmp/b bash benchmarks/gpu_pair/h200_pair_sweep_call.sh      (limits in seconds, env-overridable, sum 580;
#   T_ENGINE=0 skips the engine timing; METHODS, BUDGETS, CONCURRENCY, REPEATS, MIN_SECONDS choose the sweep's cells)
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TRITON_CACHE_DIR="$PWD/.triton_cache"
OUT=${OUT:-results/h200_pair_sweep}; R="$OUT/b"; mkdir -p "$R"
python3 benchmarks/versions.py torch transformers triton fastapi uvicorn > "$R/versions.txt" 2>&1
if [ ! -f /tmp/gpu-pair/manifest.json ]; then
    timeout -k 5 "${T_TRAIN:-370}" python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
        --eval-prompts 0 --max-minutes "${TRAIN_MINUTES:-6}" > "$R/train.log" 2>&1
    echo "train rc=$?"; grep -E "^pair|target :|drafter:" "$R/train.log"
fi
[ "${T_ENGINE:-90}" -gt 0 ] && timeout -k 5 "${T_ENGINE:-90}" python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 16 \
    --max-new-tokens 128 --budgets 16,32,64,128 --temperatures 0,1 --warmup-seconds 5 --no-progress \
    --json-out "$R/pair_engine.json" > "$R/pair_engine.txt" 2>&1
echo "engine rc=$?"; grep -E "^ *(method|ar|dflash|ddtree) " "$R/pair_engine.txt"
left=$(( ${T_TOTAL:-580} - ($(date +%s) - start) - 10 ))
OUT="$R/sweep" timeout -k 10 "$((left + 10))" python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods "${METHODS:-ar,dflash,ddtree}" --concurrency "${CONCURRENCY:-1,2,4,8,16}" --budgets "${BUDGETS:-16,32,64}" --max-new-tokens 128 --min-requests 16 \
    --min-seconds "${MIN_SECONDS:-3}" --repeats "${REPEATS:-1}" --time-budget-s "$left" > "$R/sweep.log" 2>&1
echo "sweep rc=$? (budget ${left} s)"; cat "$R/sweep/sweep.txt" 2>/dev/null | head -12
tar czf "$OUT/b.tgz" -C "$OUT" b && rm -rf "$R"
