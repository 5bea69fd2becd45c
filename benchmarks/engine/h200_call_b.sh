#!/usr/bin/env bash
# Device call B (one H200): train the `gpu` pair into /tmp/gpu-pair (kept by the warm machine for call C),
# then measure it with the engine at batch 1: tau and time per token for ar, dflash, ddtree(16..128), T = 0
# and T = 1, 32 held-out prompts x 128 new tokens, two timed passes in one process.
# Limits (seconds, env-overridable) sum to 550; training has a 5-minute wall-clock safety stop inside
# (--max-minutes 5: the `gpu` preset's fixed step schedule is unchanged unless the stop is reached, and then the
# manifest says `complete: false`), so the trained pair is saved before the 330 s kill.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/h200_call_b}; export OUT; mkdir -p "$OUT"  # train_and_eval.py reads $OUT
timeout -k 5 "${T_TRAIN:-330}" python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes "${TRAIN_MAX_MINUTES:-5}" \
    > "$OUT/train.log" 2>&1
echo "train rc=$?"; tail -4 "$OUT/train.log"
timeout -k 5 "${T_ENGINE:-220}" python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 32 --max-new-tokens 128 \
    --budgets 16,32,64,128 --temperatures 0,1 --warmup-seconds 10 --repeats 2 --no-progress \
    --json-out "$OUT/pair_engine.json" > "$OUT/pair_engine.txt" 2>&1
echo "pair engine rc=$?"; grep -v "it/s" "$OUT/pair_engine.txt" | tail -32
