#!/usr/bin/env bash
# Session 15, third H200 command (a fresh machine: the Triton cache of h200_s15_a.sh carried as .triton_cache.tgz):
# the q/k/v epilogue fused into the tree-attention kernel. Its CUDA tests and the engines' graph-vs-eager-vs-SDPA
# tests (the 8B shape's build kernels compile beside them), then the 8B cost model with its top kernels.
#   OUT=$OUT bash benchmarks/engine/h200_s15_c.sh      (carry .triton_cache.tgz)
# It ran at ea0f83c; the fused kernel was measured slower and reverted, so on main it measures the unfused one.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .triton_cache && tar xzf .triton_cache.tgz 2>/dev/null
export PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
(timeout 170 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 32,64 --batch-sizes 1 --rounds 3 \
    > /tmp/precompile_8b.txt 2>&1; echo "precompile 8b rc=$?" > /tmp/precompile_8b_rc.txt) &
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_attention.py > "$OUT/tests.txt" 2>&1
echo "attention tests rc=$?" >> "$OUT/tests.txt"; tail -3 "$OUT/tests.txt"
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/engine/test_batched.py -k "cuda_graph_rounds_equal" >> "$OUT/tests.txt" 2>&1
echo "batched cuda tests rc=$?" >> "$OUT/tests.txt"; tail -2 "$OUT/tests.txt"
wait; cat /tmp/precompile_8b_rc.txt
timeout -k 5 110 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 32,64 --batch-sizes 1 --rounds 30 \
    --tau 6.58,10.73 --profile-kernels 14 > "$OUT/cost_8b.txt" 2>&1
echo "cost 8b rc=$?"; grep -vE "^ {6}" "$OUT/cost_8b.txt" | tail -8
