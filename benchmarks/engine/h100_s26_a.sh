#!/usr/bin/env bash
# Session 26's first call: an admission's and a retirement's row-state writes as one Triton launch each
# (`triton_round.admit_row` / `retire_row`, 41 and 32 launches before, the coin key now hashed on the host) against
# session 25's main (4c154c5, carried as .ab), interleaved old / new: a request's device cost beyond its rounds at
# batch 8 (`churn_cost.py`), the engine's CUDA tests on the new code, a second old / new pass, then the host cost of an
# admission + retirement alone (`admission_cost.py`). The `gpu` pair's shape with random weights: no training. Each
# step after the first pass runs only if it fits before END_S (default 585 s).
#   rm -rf .ab && mkdir .ab && git archive 4c154c5 src benchmarks | tar -x -C .ab
#   OUT=$OUT bash benchmarks/engine/h100_s26_a.sh                  (carry .ab and .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
end_s=${END_S:-585}
fits() { [ $(( end_s - SECONDS )) -ge "$1" ]; }
churn() {  # churn TREE PASS: TREE is old (.ab) or new (this checkout)
    local root=.; [ "$1" = old ] && root=.ab
    PYTHONPATH="$PWD/$root/src:/tmp/site" timeout 150 python3 "$root/benchmarks/engine/churn_cost.py" \
        --configs dflash:15,ddtree:32 --new-tokens 20 --spread 0.5 --prompt-tokens 80 --rounds 400 --top 0 \
        > "$OUT/churn_$1_$2.txt" 2>&1
    echo "churn $1 pass $2 rc=$? (${SECONDS} s)"; grep -E "new tokens" "$OUT/churn_$1_$2.txt"
}
churn old 1; churn new 1
if fits 200; then
    timeout $(( end_s - SECONDS - 130 < 300 ? end_s - SECONDS - 130 : 300 )) python3 -m pytest -q \
        tests/engine/test_triton_round.py tests/engine/test_batched.py tests/engine/test_scheduler.py \
        -k "cuda or equals_torch or round_kernels or lazy_walk or mixed_batch or compile" > "$OUT/cuda_tests.txt" 2>&1
    echo "cuda tests rc=$? (${SECONDS} s)"; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
fi
if fits 110; then churn new 2; fi
if fits 70; then churn old 2; fi
for tree in old new; do
    fits 35 || break
    root=.; [ "$tree" = old ] && root=.ab
    PYTHONPATH="$PWD/$root/src:/tmp/site" timeout 30 python3 "$root/benchmarks/engine/admission_cost.py" \
        --device cuda --shape gpu-pair --requests 64 --passes 5 --methods ddtree,dflash --temperatures 0 \
        > "$OUT/admission_$tree.txt" 2>&1
    echo "admission $tree rc=$?"; grep -E "ms per request" "$OUT/admission_$tree.txt"
done
true
