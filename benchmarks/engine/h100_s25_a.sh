#!/usr/bin/env bash
# Session 25's plan for the next GPU call (one round in flight, main): train the `gpu` pair (CUDA tests beside it),
# batch 1 at T = 0 with budgets 32 / 64 / 128 (budget 128 not yet timed in the graphed engine), then the server at 8
# requests (dflash, ddtree at budgets 16 and 32, two interleaved passes) in the time left.
#   OUT=$OUT bash benchmarks/engine/h100_s25_a.sh      (carry .whl: bash benchmarks/gpu_pair/fetch_server_wheels.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
source benchmarks/engine/train_pair.sh
timeout ${B1_S:-120} python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 12 --max-new-tokens 128 \
    --budgets 32,64,128 --temperatures 0 --warmup-seconds 5 --repeats 2 > "$OUT/engine_b1.txt" 2>&1
echo "== batch 1 rc=$?"; grep -E "^ *(ar|dflash|ddtree) " "$OUT/engine_b1.txt" | tail -10
left=$(( ${END_S:-585} - SECONDS ))
if [ "$left" -ge 90 ]; then
    OUT=/tmp/sweep8 timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
        --methods dflash,ddtree --concurrency 8 --budgets 16,32 --max-new-tokens 128 --min-requests 16 \
        --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" > /tmp/sweep8.log 2>&1
    echo "== sweep rc=$?"; cp /tmp/sweep8/sweep.txt "$OUT/sweep_8.txt" && head -40 "$OUT/sweep_8.txt"
else
    echo "no time left for the server sweep (${left} s)"
fi
true
