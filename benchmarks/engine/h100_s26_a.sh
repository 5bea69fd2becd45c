#!/usr/bin/env bash
# Session 26's first call: an admission's and a retirement's row-state writes as one Triton launch each
# (`triton_round.admit_row` / `retire_row`, ~12 and ~32 launches before, and the coin key hashed on the host) against
# session 25's main (4c154c5, carried as .ab), interleaved old / new: a request's device cost beyond its rounds at
# batch 8 (`churn_cost.py`), the host cost of an admission + retirement alone (`admission_cost.py`), then the engine's
# CUDA tests on the new code. The `gpu` pair's shape with random weights: no training.
#   rm -rf .ab && mkdir .ab && git archive 4c154c5 src benchmarks | tar -x -C .ab
#   OUT=$OUT bash benchmarks/engine/h100_s26_a.sh                  (carry .ab and .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
tree_of() { if [ "$1" = old ]; then echo .ab; else echo .; fi; }
for pass in 1 2; do
    for tree in old new; do
        root=$(tree_of $tree)
        PYTHONPATH="$PWD/$root/src:/tmp/site" timeout 150 python3 "$root/benchmarks/engine/churn_cost.py" \
            --configs dflash:15,ddtree:32 --new-tokens 20 --spread 0.5 --prompt-tokens 80 --rounds 400 --top 0 \
            > "$OUT/churn_${tree}_$pass.txt" 2>&1
        echo "churn $tree pass $pass rc=$?"; grep -E "new tokens" "$OUT/churn_${tree}_$pass.txt"
    done
done
timeout 300 python3 -m pytest -q tests/engine/test_triton_round.py tests/engine/test_batched.py \
    tests/engine/test_scheduler.py -k "cuda or equals_torch or round_kernels or lazy_walk or mixed_batch" \
    > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests rc=$?"; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
for tree in old new; do
    root=$(tree_of $tree)
    PYTHONPATH="$PWD/$root/src:/tmp/site" timeout 60 python3 "$root/benchmarks/engine/admission_cost.py" \
        --device cuda --shape gpu-pair --requests 64 --passes 5 --methods ddtree,dflash --temperatures 0 \
        > "$OUT/admission_$tree.txt" 2>&1
    echo "admission $tree rc=$?"; grep -E "ms per request" "$OUT/admission_$tree.txt"
done
true
