#!/usr/bin/env bash
# One 10-minute H200 command for the session after 10 (issue 12): the batched engine's CUDA tests beside the
# pair's training (session 10 changed the row retirement after its last GPU run: the cache slots are now copied
# outside the captured state program, and only the moved request's rows), then the server at 8 requests, three
# interleaved passes, as in session 10's call 3 (ddtree 1.07-1.12x dflash, 1.51-1.65x ar before the admission
# change; the admission work per request fell from 1.7-2.1 to 0.55-0.64 ms), then one request; 5-second levels
# (3 before) for passes that agree better.
#   tar xzf .triton_cache.tgz; OUT=$OUT bash benchmarks/engine/h200_s11_a.sh      (carry .triton_cache.tgz, .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/t"
(PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_batched.py -k cuda tests/core/test_triton_build.py::test_triton_beam_is_used_on_cuda \
    > "$OUT/t/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/t/tests.txt") &
MIN_SECONDS=5 REPEATS=3 CONCURRENCY=8,1 T_ENGINE=0 BUDGETS=32 T_TOTAL=560 OUT="$OUT" bash benchmarks/gpu_pair/h200_pair_sweep_call.sh
wait
tail -3 "$OUT/t/tests.txt"
