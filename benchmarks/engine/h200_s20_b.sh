#!/usr/bin/env bash
# Session 20, second GPU command, on the machine call A left warm (its pair in /tmp/gpu-pair, its compile caches in
# /tmp/compile_cache): the server's throughput against concurrency (1, 2, 4, 8, 16 requests; ar, dflash, ddtree at
# budgets 16, 32, 64; T = 0, 128 new tokens), one pass, with the final code; then the Qwen3-8B shape's cost model at
# batch 1 and 8 (random weights) in the time left.
#   OUT=$OUT bash benchmarks/engine/h200_s20_b.sh      (carry .whl; after h200_s20_a.sh on the same machine)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
[ -f /tmp/gpu-pair/manifest.json ] || { echo "no pair in /tmp/gpu-pair: call A's machine is gone"; exit 3; }
OUT=/tmp/sweep timeout -k 10 ${SWEEP_S:-330} python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8,1,16,2,4 --budgets 16,32,64 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 1 --time-budget-s $((${SWEEP_S:-330} - 10)) > /tmp/sweep.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep/sweep.txt "$OUT/sweep.txt"; gzip -c /tmp/sweep/sweep.json > "$OUT/sweep.json.gz"
cat "$OUT/sweep.txt"; tail -3 /tmp/sweep.log
left=$((${END_S:-585} - SECONDS))
echo "== 8B cost model, ${left} s"
timeout -k 5 "$left" python3 -m ddtree.cli bench engine --random-weights qwen3-8b --methods ar,dflash,ddtree \
    --budgets 16,32,64 --batch-sizes 1,8 --rounds 20 > "$OUT/cost_8b.txt" 2>&1
echo "8B rc=$?"; tail -30 "$OUT/cost_8b.txt"
true
