#!/usr/bin/env bash
# Session 17, first H200 command (issue 12's last target: the server at 8 concurrent requests, T = 0): the full
# pair's training, then the server sweep at 8, 1, 16, 2 and 4 requests, budgets 16, 32 and 64, with the code of
# this session: the engine process's pipe on the server's event loop (session 16's call C, never measured: its
# sweep ran out of time compiling), the load generator on aiohttp, the three servers started at once. Beside the
# training: a cost-model run of the pair's shape (it fills the compile caches the servers then read) and the
# server's own cost around a stub engine on this host's CPU. The compile caches come back as compile_cache.tgz.
#   OUT=$OUT bash benchmarks/engine/h200_s17_a.sh      (carry .whl; and compile_cache.tgz if this checkout has one)
# Fits the 600 s a command may run: training 315 s at most, the sweep 255 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
(timeout 200 python3 -m ddtree.cli bench engine --random-weights gpu-pair --budgets 16,32,64 --batch-sizes 1,8 \
    --rounds 5 > "$OUT/precompile.txt" 2>&1; echo "precompile rc=$?" >> "$OUT/precompile.txt") &
(for h in 0 0.3; do timeout 100 python3 benchmarks/server_overhead.py --concurrency 1,8 --round-ms 0.5 --host-ms $h \
    --tau 6 --requests 400 --repeats 2 2>/dev/null; done > "$OUT/stub_server.txt" 2>&1) &
OUT=/tmp/train_out timeout -k 5 315 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 5.0 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log
wait; tail -1 "$OUT/precompile.txt"
OUT=/tmp/sweep timeout -k 10 255 python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8,1,16,2,4 --budgets 16,32,64 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 1 --time-budget-s 245 > /tmp/sweep.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep/sweep.txt "$OUT/sweep.txt"; gzip -c /tmp/sweep/sweep.json > "$OUT/sweep.json.gz"
tail -c 20000 /tmp/sweep/server_ddtree.log > "$OUT/server_ddtree_tail.log"
cat "$OUT/sweep.txt"
tar czf /tmp/compile_cache.tgz -C /tmp/compile_cache . && size=$(stat -c %s /tmp/compile_cache.tgz) && echo "compile cache $size bytes"
[ "${size:-0}" -lt 16000000 ] && cp /tmp/compile_cache.tgz "$OUT/compile_cache.tgz"
true
