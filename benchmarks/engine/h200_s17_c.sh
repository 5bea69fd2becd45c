#!/usr/bin/env bash
# Session 17, third H200 command: where a round's device time goes at batch 8 (the server at 8 requests is bound by
# the device: its loop waits ~0.35 ms a round, and a ddtree(32) round took 0.66 ms against dflash's 0.61). The
# `gpu` pair's shape with random weights, rounds overlapped as when serving (no stage timing in the timed rounds),
# each cell's top kernels per round from torch.profiler, on an otherwise idle GPU.
#   OUT=$OUT bash benchmarks/engine/h200_s17_c.sh      (carry compile_cache.tgz if this checkout has one)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
timeout 400 python3 -m ddtree.cli bench engine --random-weights gpu-pair --methods ar,dflash,ddtree --budgets 16,32,64 \
    --batch-sizes 1,4,8 --rounds 200 --profile-kernels 30 --json-out "$OUT/cost_model.json" 2>&1 | tee "$OUT/cost_model.txt"
echo "cost model rc=$?"
