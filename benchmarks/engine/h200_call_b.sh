#!/usr/bin/env bash
# Device call B (one H200): train the `gpu` pair into /tmp/gpu-pair (kept by the warm machine for call C),
# then measure it with the engine at batch 1: tau and time per token for ar, dflash, ddtree(16..128), T = 0
# and T = 1, 32 held-out prompts x 128 new tokens, two timed passes in one process.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/h200_call_b}; mkdir -p "$OUT"
timeout -k 5 330 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    > "$OUT/train.log" 2>&1
echo "train rc=$?"; tail -4 "$OUT/train.log"
timeout -k 5 230 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 32 --max-new-tokens 128 \
    --budgets 16,32,64,128 --temperatures 0,1 --warmup-seconds 10 --repeats 2 --no-progress \
    --json-out "$OUT/pair_engine.json" > "$OUT/pair_engine.txt" 2>&1
echo "pair engine rc=$?"; grep -v "it/s" "$OUT/pair_engine.txt" | tail -32
