#!/usr/bin/env bash
# Core checks and timings on one GPU (run through the device tool from the repo root; results under $OUT).
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-results/h200}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
timeout 90 python3 -m ddtree.cli selfcheck --device cuda --out "$OUT/selfcheck_cuda.json"; echo "selfcheck rc=$?"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/test_kernels.py tests/core/test_build.py 2>&1 | tail -15 | tee "$OUT/pytest_core_cuda.txt"
timeout 300 python3 -m ddtree.cli bench core --check --json-out "$OUT/bench_core_h200.json" 2>&1 | tee "$OUT/bench_core_h200.txt"
echo "bench core rc=$?"
