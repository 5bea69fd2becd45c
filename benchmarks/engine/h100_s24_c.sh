#!/usr/bin/env bash
# Session 24, third call, on the machine h100_s24_b.sh left warm (its pair in /tmp/gpu-pair): the engine at batch 1
# (T = 0, 12 prompts x 128 new tokens, budgets 32 / 64 / 128, two passes) at overlap depths 1 and 2, then the server at
# 8 requests once more a depth in the opposite order (depth 2 first), in the time left.
#   OUT=$OUT bash benchmarks/engine/h100_s24_c.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
[ -d /tmp/gpu-pair ] || { echo "no trained pair in /tmp/gpu-pair (a fresh machine): run h100_s24_b.sh first"; exit 0; }
for depth in ${B1_DEPTHS:-1 2}; do
    DDTREE_OVERLAP_DEPTH=$depth timeout 110 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
        --num-prompts 12 --max-new-tokens 128 --budgets 32,64,128 --temperatures 0 --warmup-seconds 5 --repeats 2 \
        > "$OUT/engine_b1_depth$depth.txt" 2>&1
    echo "== batch 1 depth $depth rc=$?"; grep -E "^ *(ar|dflash|ddtree) " "$OUT/engine_b1_depth$depth.txt" | tail -10
done
depths=${DEPTHS:-2 1}
n=$(echo $depths | wc -w); i=0
for depth in $depths; do
    left=$(( (${END_S:-585} - SECONDS) / (n - i) )); i=$((i + 1))
    [ "$left" -lt 60 ] && { echo "no time left for depth $depth (${left} s)"; continue; }
    DDTREE_OVERLAP_DEPTH=$depth OUT=/tmp/sweepc_d$depth timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py \
        --pair /tmp/gpu-pair --methods dflash,ddtree --concurrency 8 --budgets 32 --max-new-tokens 128 \
        --min-requests 16 --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" \
        > /tmp/sweepc_d$depth.log 2>&1
    echo "== sweep depth $depth rc=$?"; cp /tmp/sweepc_d$depth/sweep.txt "$OUT/sweep_8_depth$depth.txt" && head -16 "$OUT/sweep_8_depth$depth.txt"
done
true
