#!/usr/bin/env bash
# One H200 command (run with carry [".whl"] after fetch_server_wheels.sh) for what this pair still owes:
# train the `gpu` pair into /tmp/gpu-pair, raw vs processed trees on it (issue 14, item 3), then the server's
# throughput against concurrency for ar / dflash / ddtree (issue 12). Limits (seconds, env-overridable) sum to 560.
#   OUT=/tmp/pair bash benchmarks/gpu_pair/h200_pair_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/h200_pair}; export OUT; mkdir -p "$OUT"
if [ ! -d /tmp/gpu-pair/target ]; then
    timeout -k 5 "${T_TRAIN:-320}" python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
        --eval-prompts 0 --max-minutes "${TRAIN_MAX_MINUTES:-5}" > "$OUT/train.log" 2>&1
    echo "train rc=$?"; tail -3 "$OUT/train.log"
fi
timeout -k 5 "${T_TREES:-70}" python3 benchmarks/tree_sampling.py --model /tmp/gpu-pair --device cuda --dtype bfloat16 \
    --num-prompts 8 --samples 2 --max-new-tokens 64 --budget 16 > "$OUT/tree_sampling.txt" 2>&1
echo "tree sampling rc=$?"; tail -12 "$OUT/tree_sampling.txt"
OUT="$OUT/sweep" timeout -k 10 "${T_SWEEP:-170}" python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --concurrency 1,2,4,8,16 --budgets 16,32,64 --max-new-tokens 128 --min-requests 16 > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v "throughput c=" "$OUT/sweep.log" | tail -20
