#!/usr/bin/env bash
# Device call A (one H200): the engine's CUDA tests, then the cost model of the 8B shape with both attention
# backends (SDPA reference, Triton kernel) and each cell's top GPU kernels, then 4B / 30B-A3B-dense shapes.
# Limits (seconds, env-overridable) sum to 510 (+5 s kill grace each), inside one 600 s device command.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/h200_call_a}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 benchmarks/versions.py torch triton transformers >> "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout -k 5 "${T_PYTEST:-140}" python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_triton_attention.py \
    tests/engine/test_batched.py > "$OUT/pytest_engine_cuda.txt" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest_engine_cuda.txt"
timeout -k 5 "${T_COST:-260}" python3 -m ddtree.cli bench engine --random-weights qwen3-8b --attention sdpa,triton \
    --budgets 16,64,128,256 --batch-sizes 1,8 --rounds 30 --tau 6.58,10.73 --profile-kernels 10 \
    --json-out "$OUT/cost_8b.json" > "$OUT/cost_8b.txt" 2>&1
echo "cost 8b rc=$?"; grep -A40 "^attention  B" "$OUT/cost_8b.txt" | head -30
for shape in qwen3-4b qwen3-coder-30b-a3b-dense; do
    timeout -k 5 "${T_SHAPE:-55}" python3 -m ddtree.cli bench engine --random-weights "$shape" --attention triton \
        --budgets 16,64 --batch-sizes 1 --rounds 20 --tau 6.58 --json-out "$OUT/cost_$shape.json" \
        > "$OUT/cost_$shape.txt" 2>&1
    echo "cost $shape rc=$?"; grep -A6 "^attention  B" "$OUT/cost_$shape.txt"
done
