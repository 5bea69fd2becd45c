#!/usr/bin/env bash
# One-call H200 measurement: core timings (build + verify), the `large` embedded pair trained on the GPU,
# and the engine benchmark on it (falls back to a carried CPU-trained pair if training fails).
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-results/h200}; mkdir -p "$OUT"
TRAIN_MIN=${TRAIN_MIN:-2.0}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/env.txt"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/core/test_kernels.py 2>&1 | tail -4
timeout 120 python3 -m ddtree.cli bench core --batch-sizes 1,64 --budgets 32,128 --repeats 20 \
  --json-out "$OUT/core.json" 2>&1 | tail -6
timeout 240 python3 -m ddtree.cli train-pair --size large --device cuda --out /tmp/large \
  --max-minutes "$TRAIN_MIN" --eval-prompts 16 --no-progress > "$OUT/train_large.log" 2>&1
echo "train rc=$?"; tail -4 "$OUT/train_large.log"
PAIR=/tmp/large; [ -f /tmp/large/drafter/config.json ] || PAIR=.device_pair/small
cp "$PAIR/manifest.json" "$OUT/manifest.json" 2>/dev/null
timeout 170 python3 -m ddtree.cli bench engine --model "$PAIR" --device cuda --num-prompts 6 \
  --max-new-tokens 128 --budgets 16,64,256 --temperatures 0,1 --no-progress \
  --json-out "$OUT/engine.json" 2>&1 | tail -12
