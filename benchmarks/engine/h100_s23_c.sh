#!/usr/bin/env bash
# Session 23, third call, on the machine the second left warm (/tmp/gpu-pair and the compile caches kept): the
# engine at batch 1 (T = 0 and 1, 128 new tokens, two passes) with the tree temperature, then with raw trees.
#   OUT=$OUT bash benchmarks/engine/h100_s23_c.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
[ -f /tmp/gpu-pair/target/config.json ] || [ -d /tmp/gpu-pair ] || { echo "no trained pair (a cold machine)"; exit 3; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
for side in new raw; do
    raw=0; [ $side = raw ] && raw=1
    left=$((${END_S:-420} - SECONDS)); [ $side = new ] && left=$((left * 6 / 10))
    DDTREE_RAW_SAMPLED_TREES=$raw timeout $left python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
        --num-prompts 12 --max-new-tokens 128 --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --repeats 2 \
        > "$OUT/engine_b1_$side.txt" 2>&1
    echo "== $side rc=$?"; grep -E "^ *(ar|dflash|ddtree) |^pass" "$OUT/engine_b1_$side.txt"
done
true
