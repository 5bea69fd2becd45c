#!/usr/bin/env bash
# Session 11's last H200 command (~8 minutes, issue 12): the launch rule refitted to call 2's sweeps, measured where
# it matters. The `gpu` pair trained (the tree-attention CUDA tests beside it), then timed in the engine at batch 1
# (T = 0 and 1, budgets 32 / 64: the ddtree / dflash targets 1.3x and 1.2x), then the 8B cost model at batch 1.
# Every file is written straight under $OUT, so a run cut short still returns what it finished.
#   tar xzf .triton_cache.tgz; OUT=/tmp/s11c bash benchmarks/engine/h200_s11_c.sh   (limits: env T_TRAIN, T_ENGINE, T_COST)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRITON_CACHE_DIR="$PWD/.triton_cache"
R=${OUT:-results/h200_s11_c}; mkdir -p "$R"
python3 benchmarks/versions.py torch transformers triton > "$R/versions.txt" 2>&1
timeout -k 5 250 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_attention.py \
    > "$R/tests_attention.txt" 2>&1 &
timeout -k 5 "${T_TRAIN:-340}" python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 6 > "$R/train.log" 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" "$R/train.log"
wait; echo "attention tests:"; tail -1 "$R/tests_attention.txt"
timeout -k 5 "${T_ENGINE:-100}" python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 16 \
    --max-new-tokens 128 --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --no-progress \
    --json-out "$R/pair_engine.json" > "$R/pair_engine.txt" 2>&1
echo "pair engine rc=$?"; grep -E "^ *(method|ar|dflash|ddtree) " "$R/pair_engine.txt"
timeout -k 5 "${T_COST:-70}" python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 32,64 \
    --batch-sizes 1 --rounds 30 --tau 6.58,10.73 --profile-kernels 12 \
    --json-out "$R/cost_8b.json" > "$R/cost_8b.txt" 2>&1
echo "cost 8B rc=$?"; grep -A6 "^attention  B" "$R/cost_8b.txt"
