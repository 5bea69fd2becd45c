#!/usr/bin/env bash
# H200 measurement of this session's code, in two calls of under 10 minutes each:
#   PART=tests : the CUDA tests of the core (build, Triton kernels, verify) and `ddtree selfcheck --device cuda`;
#   PART=bench : `ddtree bench core` over the issue's whole grid (B 1,8,32,64 x budget 32,64,128,256, build and
#                verify) with the breakdown at B = 64 / budget 128, then `ddtree bench engine` on the default
#                `small` pair carried in .device_pair/small (bf16).
# Run from the repository root with pytest and hypothesis on PYTHONPATH, e.g.
#   pip install --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site OUT=$OUT PART=bench bash benchmarks/h200_session3.sh
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-results/h200}; mkdir -p "$OUT"
PAIR=${PAIR:-.device_pair/small}
PART=${PART:-bench}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
if [ "$PART" = tests ]; then
  # the opt-in radix-select ("fused") tests recompile per shape and take minutes: left out here
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/core -k "not fused_step and not fused_top" \
    > "$OUT/pytest_core.log" 2>&1
  echo "pytest tests/core rc=$?"; tail -4 "$OUT/pytest_core.log"
  timeout 120 python3 -m ddtree.cli selfcheck --device cuda --out "$OUT/selfcheck.json" > "$OUT/selfcheck.log" 2>&1
  echo "selfcheck rc=$?"; tail -12 "$OUT/selfcheck.log"
else
  timeout 260 python3 -m ddtree.cli bench core --check --breakdown 64,128 --json-out "$OUT/core_grid.json" \
    2> "$OUT/core_grid.err" | tee "$OUT/core_grid.txt"
  echo "bench core rc=${PIPESTATUS[0]}"
  cp "$PAIR/manifest.json" "$OUT/pair_manifest.json" 2>/dev/null
  timeout 200 python3 -m ddtree.cli bench engine --model "$PAIR" --device cuda --num-prompts 16 \
    --max-new-tokens 128 --budgets 16,64 --temperatures 0,1 --no-progress \
    --json-out "$OUT/engine_small.json" 2>&1 | tail -9
  echo "bench engine rc=${PIPESTATUS[0]}"
fi
