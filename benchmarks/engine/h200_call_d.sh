#!/usr/bin/env bash
# Device call D (one H200), the make-up call of session 6 after calls A and C ran into their limits:
# the 8B cost model's Triton cells at batch 8 (call A stopped inside them at its 260 s limit), the two CUDA
# tests call A's 140 s pytest limit cut off (CUDA graph rounds == eager rounds, ddtree 16 and 5), and a
# diagnosis of call C's old-vs-new core check (the old tree's `bench core --check` at B = 1 ran past 240 s):
# each version's B = 1 process under a 60 s limit that ends it with SIGINT, so its traceback shows where it was.
# Limits sum to 380 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/h200_call_d}; mkdir -p "$OUT"
export PYTHONPATH="$PWD/src"
timeout -k 5 "${T_COST:-140}" python3 -m ddtree.cli bench engine --random-weights qwen3-8b --attention triton \
    --budgets 16,64,128,256 --batch-sizes 8 --rounds 30 --tau 6.58,10.73 --profile-kernels 10 \
    --json-out "$OUT/cost_8b_triton_b8.json" > "$OUT/cost_8b_triton_b8.txt" 2>&1
echo "cost 8b triton B=8 rc=$?"; grep -A8 "^attention  B" "$OUT/cost_8b_triton_b8.txt"
timeout -k 5 "${T_PYTEST:-120}" python3 -m pytest -v -p no:cacheprovider tests/engine/test_batched.py \
    -k "cuda_graph_rounds_equal_eager_rounds and ddtree" > "$OUT/pytest_rest.txt" 2>&1
echo "pytest rc=$?"; tail -6 "$OUT/pytest_rest.txt"
for version in old new; do
    src="$PWD/src"; [ "$version" = old ] && src="$PWD/.old_core/src"
    PYTHONPATH="$src" timeout -s INT -k 5 "${T_CORE:-60}" python3 -m ddtree.cli bench core --check \
        --batch-sizes 1 --budgets 32,64,128,256 --vocab 151936 --depth 15 \
        --json-out "$OUT/core_${version}_b1.json" > "$OUT/core_${version}_b1.txt" 2>&1
    echo "core $version B=1 rc=$?"; tail -14 "$OUT/core_${version}_b1.txt"
done
