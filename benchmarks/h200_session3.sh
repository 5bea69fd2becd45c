#!/usr/bin/env bash
# One-call H200 measurement of this session's code (about 9 minutes):
#   1. the core CUDA tests, 2. `ddtree selfcheck --device cuda`,
#   3. `ddtree bench core` over the issue's whole grid (B 1,8,32,64 x budget 32,64,128,256, build + verify)
#      with the breakdown at B = 64 / budget 128,
#   4. `ddtree bench engine` on the default `small` pair carried in .device_pair/small (bf16).
# Run from the repository root with pytest and hypothesis on PYTHONPATH, e.g.
#   pip install --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site OUT=$OUT bash benchmarks/h200_session3.sh
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-results/h200}; mkdir -p "$OUT"
PAIR=${PAIR:-.device_pair/small}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core > "$OUT/pytest_core.log" 2>&1
echo "pytest tests/core rc=$?"; tail -3 "$OUT/pytest_core.log"
timeout 90 python3 -m ddtree.cli selfcheck --device cuda --out "$OUT/selfcheck.json" > "$OUT/selfcheck.log" 2>&1
echo "selfcheck rc=$?"; tail -3 "$OUT/selfcheck.log"
timeout 200 python3 -m ddtree.cli bench core --check --breakdown 64,128 --json-out "$OUT/core_grid.json" \
  2> "$OUT/core_grid.err" | tee "$OUT/core_grid.txt"
echo "bench core rc=${PIPESTATUS[0]}"
cp "$PAIR/manifest.json" "$OUT/pair_manifest.json" 2>/dev/null
timeout 170 python3 -m ddtree.cli bench engine --model "$PAIR" --device cuda --num-prompts 16 \
  --max-new-tokens 128 --budgets 16,64 --temperatures 0,1 --no-progress \
  --json-out "$OUT/engine_small.json" 2>&1 | tail -9
echo "bench engine rc=${PIPESTATUS[0]}"
