#!/usr/bin/env bash
# Session 18, fourth GPU command (~4 minutes of device time left): the draft's lm_head over the whole block (B x 16
# rows) against B x 15 rows (.ab/old: the code before), the Qwen3-8B shape at batch 8 and 1, dflash and ddtree(32);
# then the CUDA graph tests of the batched engine in the time left.
# Not run (session 18 had no device time left); the change was reverted until measured (660836d). To run it: `git revert
# 660836d` (re-applies 4961a9e), `mkdir -p .ab/old && git archive 660836d src | tar x -C .ab/old` (main's engine as old),
# then
#   OUT=$OUT bash benchmarks/engine/h200_s18_d.sh      (carry .ab, and compile_cache.tgz where this checkout has one)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
for side in new old; do
    root=$PWD; [ $side = old ] && root=$PWD/.ab/old
    echo "== $side"
    PYTHONPATH="$root/src" timeout 45 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --methods dflash,ddtree \
        --budgets 32 --batch-sizes 8,1 --rounds 20 > "$OUT/lm_head_$side.txt" 2>&1
    grep -E "^triton B=" "$OUT/lm_head_$side.txt"
done
PYTHONPATH="$PWD/src" timeout $((165 - SECONDS)) python3 -m pytest -q tests/engine/test_batched.py \
    -k "cuda_graph_rounds_equal_eager or overlapped_rounds_equal_unoverlapped" > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests rc=$?"; tail -3 "$OUT/cuda_tests.txt"
