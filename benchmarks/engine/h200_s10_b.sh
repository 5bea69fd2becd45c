#!/usr/bin/env bash
# One short H200 command (issue 12, session 10, after h200_s10_a.sh): the CUDA tests of the code as committed (the
# beam kernel with the tau cut now on from width 64, step()'s lists, the staged prefill in graphed rounds), the
# beam's launch at widths 64 / 128 and batch 8 (call a reached only W = 64, B = 1), and the `gpu` pair's shape at
# batch 1 and 8 under the refitted attention rule (where a round at 8 requests goes).
#   tar xzf .triton_cache.tgz; OUT=/tmp/s10b bash benchmarks/engine/h200_s10_b.sh   (limits: env T_TEST, T_BEAM, T_COST)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
OUT=${OUT:-results/h200_s10_b}; R="$OUT/b"; mkdir -p "$R"
timeout -k 5 "${T_TEST:-200}" python3 -m pytest -q -p no:cacheprovider \
    "tests/core/test_triton_build.py::test_triton_beam_is_used_on_cuda" \
    "tests/core/test_triton_build.py::test_triton_beam_equals_torch_beam" \
    "tests/core/test_triton_build.py::test_the_tau_cut_keeps_the_beam_exact" \
    tests/engine/test_batched.py -k "cuda or 64-128 or width" > "$R/tests.txt" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAIL|Error" "$R/tests.txt" | tail -8
timeout -k 5 "${T_BEAM:-90}" python3 benchmarks/beam_launch.py --widths 128,64 --batch-sizes 1,8 --warps 8 \
    --prunes 0,4 --deadline-s "$(( ${T_BEAM:-90} - 20 ))" --json-out "$R/beam_launch.json" > "$R/beam_launch.txt" 2>&1
echo "beam launch rc=$?"; grep "^W" "$R/beam_launch.txt"
timeout -k 5 "${T_COST:-80}" python3 -m ddtree.cli bench engine --random-weights gpu-pair --budgets 32,64 \
    --batch-sizes 1,8 --rounds 50 --tau 5.55,6.99 --profile-kernels 8 --json-out "$R/cost_gpu_pair.json" \
    > "$R/cost_gpu_pair.txt" 2>&1
echo "cost gpu-pair rc=$?"; grep -A9 "^attention  B" "$R/cost_gpu_pair.txt"
tar czf "$OUT/b.tgz" -C "$OUT" b && rm -rf "$R"
