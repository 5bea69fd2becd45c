#!/usr/bin/env bash
# One 10-minute H200 command (issue 12, session 9): the CUDA tests of this session's changes (temperature-aware
# build CUDA vs CPU, the Triton tree assembly at budget 1, graph == eager rounds with the staged prefill), then the
# `gpu` pair trained and the server's throughput against concurrency with the graphed prefill, the merged stream
# events and the short GIL switch interval; the Triton cache back at the end.
#   tar xzf .triton_cache.tgz; OUT=/tmp/s9a bash benchmarks/engine/h200_s9_a.sh     (carry .whl, .triton_cache.tgz)
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
# the tests need no server wheels; h200_pair_sweep_call.sh installs them for the sweep
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
OUT=${OUT:-results/h200_s9_a}; R="$OUT/tests"; mkdir -p "$R"
timeout -k 5 "${T_TESTS:-120}" python3 -m pytest -q -p no:cacheprovider tests/core/test_build_sampling.py \
    "tests/core/test_triton_build.py" -k "cuda or tree_from_beam" > "$R/pytest_core.txt" 2>&1
echo "pytest core rc=$?"; tail -1 "$R/pytest_core.txt"
timeout -k 5 "${T_TESTS_B:-100}" python3 -m pytest -q -p no:cacheprovider tests/engine/test_batched.py \
    -k "cuda_graph_rounds and (ar-1 or ddtree-16)" > "$R/pytest_batched.txt" 2>&1
echo "pytest batched rc=$?"; tail -1 "$R/pytest_batched.txt"
left=$(( ${T_ALL:-575} - ($(date +%s) - start) ))
OUT="$OUT" T_TOTAL="$left" T_ENGINE=0 BUDGETS="${BUDGETS:-16,32}" bash benchmarks/gpu_pair/h200_pair_sweep_call.sh
tar czf "$OUT/triton_cache.tgz" .triton_cache 2>/dev/null; ls -la "$OUT"
