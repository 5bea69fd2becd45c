#!/usr/bin/env bash
# Session 12's first H200 command (issue 12): the CUDA tests of the engine beside the pair's training, the pair in
# the engine at batch 1 (budgets 16-128, T = 0 and 1), the server at 8 and 1 requests (budgets 32 and 64, two
# interleaved passes), then the pair's shape with random weights profiled per stage and kernel (batch 1 and 8).
# As run, the engine timing and the server did not fit T_TOTAL=480 after a 290 s training (see
# benchmarks/results/2026-12-03/h200-s12/README.md); the server then ran in a second call on the warm machine.
#   tar xzf .triton_cache.tgz; OUT=$OUT bash benchmarks/engine/h200_s12_a.sh      (carry .triton_cache.tgz, .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/t"
(PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_batched.py -k cuda tests/engine/test_triton_attention.py \
    > "$OUT/t/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/t/tests.txt") &
MIN_SECONDS=5 REPEATS=2 CONCURRENCY=8,1 T_ENGINE=90 BUDGETS=32,64 T_TOTAL=480 OUT="$OUT" \
    bash benchmarks/gpu_pair/h200_pair_sweep_call.sh
wait
# where a round of the pair's shape spends its time, per stage and kernel (random weights: cost only)
PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" timeout 90 python3 -m ddtree.cli bench engine \
    --random-weights gpu-pair --budgets 16,64,128 --batch-sizes 1,8 --rounds 40 --profile-kernels 40 \
    --json-out "$OUT/cost_pair.json" > "$OUT/cost_pair.txt" 2>&1; echo "cost rc=$?"
tail -3 "$OUT/t/tests.txt"
