#!/usr/bin/env bash
# One 10-minute H200 command, no training (issue 12, for the session after 9): the beam kernel's launch choices
# (the budget-64 build: 110 us of beam at width 64, 13-17 us at 16-32), then the Qwen3-8B-shaped cost model with
# the refitted tree-attention launch rule (session 6 measured it with the old rule: `ar` 1.34x its floor,
# ddtree(64) 1.49x), per stage and per kernel.
#   tar xzf .triton_cache.tgz; OUT=/tmp/s10a bash benchmarks/engine/h200_s10_a.sh   (limits: env T_TEST, T_BEAM, T_COST)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
OUT=${OUT:-results/h200_s10_a}; R="$OUT/a"; mkdir -p "$R"
python3 benchmarks/versions.py torch transformers triton > "$R/versions.txt" 2>&1
# the CUDA-only tests on the code as committed (the changed beam kernel, step()'s lists, the staged prefill)
timeout -k 5 "${T_TEST:-110}" python3 -m pytest -q -p no:cacheprovider tests/core/test_triton_build.py \
    tests/engine/test_batched.py -k "cuda or tau_cut or beam or graph" > "$R/tests.txt" 2>&1
echo "tests rc=$?"; tail -5 "$R/tests.txt"
timeout -k 5 "${T_BEAM:-160}" python3 benchmarks/beam_launch.py --widths 64,128,32 --batch-sizes 1,8 \
    --warps 4,8 --prunes 0,2,4 --deadline-s "$(( ${T_BEAM:-160} - 30 ))" --json-out "$R/beam_launch.json" > "$R/beam_launch.txt" 2>&1
echo "beam launch rc=$?"; grep -v -i warn "$R/beam_launch.txt" | tail -30
timeout -k 5 "${T_COST:-300}" python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 16,64,128 \
    --batch-sizes 1,8 --rounds 30 --tau 6.58,10.73 --profile-kernels 10 \
    --json-out "$R/cost_8b.json" > "$R/cost_8b.txt" 2>&1
echo "cost 8B rc=$?"; grep -A12 "^attention  B" "$R/cost_8b.txt"
tar czf "$OUT/a.tgz" -C "$OUT" a && rm -rf "$R"
