#!/usr/bin/env bash
# For the session after 15 (issue 12's last target: the server at 8 requests), one H200 command: the full pair's
# training beside a cost-model run of its shape that compiles the build kernels, then the server at 8 and 1
# requests with overlapped rounds and, new in session 15, each level's per-request table (waiting for a row, in
# the engine, handed back to the event loop, the client's cycle), and the Triton cache back; beside the training, the
# server's own cost around a stub engine on this host's CPU (`benchmarks/server_overhead.py`).
#   OUT=$OUT bash benchmarks/engine/h200_s16_a.sh      (carry .whl; and .triton_cache.tgz if this checkout has one)
# Fits the 600 s a command may run: training 330 s (the compile beside it 150 s at most), the sweep 235 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .triton_cache "$OUT"
[ -f .triton_cache.tgz ] && tar xzf .triton_cache.tgz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
touch /tmp/before_s16  # the Triton cache entries written after this come back
(timeout 150 python3 -m ddtree.cli bench engine --random-weights gpu-pair --budgets 16,32 --batch-sizes 1,8 --rounds 5 \
    > "$OUT/precompile.txt" 2>&1; echo "precompile rc=$?" >> "$OUT/precompile.txt") &
# the server's own cost on this host's CPU: the real app and client around a stub engine (sleeps for the device)
(for h in 0 0.3; do timeout 100 python3 benchmarks/server_overhead.py --concurrency 1,8 --round-ms 0.5 --host-ms $h \
    --tau 6 --requests 400 --repeats 2 2>/dev/null; done > "$OUT/stub_server.txt" 2>&1) &
OUT=/tmp/train_out timeout -k 5 330 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes 5.3 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log
wait; tail -1 "$OUT/precompile.txt"
OUT=/tmp/sweep timeout -k 10 235 python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8,1 --budgets 16,32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 4 --repeats 1 --time-budget-s 225 > /tmp/sweep.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep/sweep.txt "$OUT/sweep.txt"; gzip -c /tmp/sweep/sweep.json > "$OUT/sweep.json.gz"
cat "$OUT/sweep.txt"
find .triton_cache -newer /tmp/before_s16 -type f > /tmp/new_cache_files
tar czf "$OUT/triton_cache_new.tgz" -T /tmp/new_cache_files && ls -la "$OUT/triton_cache_new.tgz"
