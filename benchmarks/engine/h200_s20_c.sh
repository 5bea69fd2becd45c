#!/usr/bin/env bash
# Session 20, third GPU command, on a fresh machine: a second full training of the `gpu` pair with the final code, for
# the spread between trainings of the figures that depend on the pair (call A's evaluation was cut by its timeout).
# Beside the training (nothing timed while it trains): a short cost-model run of the pair's shape that fills the
# compile caches. Then the pair's teacher-forced taus on 24 held-out prompts (item 4), the engine at batch 1 (T = 0
# and 1, 128 new tokens, two passes), and the server at 8 concurrent requests (T = 0) in the time left.
#   OUT=$OUT bash benchmarks/engine/h200_s20_c.sh      (carry .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout 200 python3 -m ddtree.cli bench engine --random-weights gpu-pair --budgets 32 --batch-sizes 1,8 \
    --rounds 5 > "$OUT/precompile.txt" 2>&1; echo "precompile rc=$?" >> "$OUT/precompile.txt") &
OUT=/tmp/train_out timeout -k 5 425 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 24 --budgets 16,32,64 --max-minutes 5.0 --eval-deadline-s 395 > /tmp/train.log 2>&1
echo "train rc=$?"
cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null || tail -5 /tmp/train.log > "$OUT/train.txt"
cat "$OUT/train.txt"; cp /tmp/train_out/status.json "$OUT/train_status.json" 2>/dev/null
wait; tail -1 "$OUT/precompile.txt"
timeout 90 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 12 --max-new-tokens 128 \
    --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --repeats 2 > "$OUT/engine_b1.txt" 2>&1
echo "engine rc=$?"; grep -E "^ *(ar|dflash|ddtree) |pass|repeats" "$OUT/engine_b1.txt" | tail -11
left=$((${END_S:-588} - SECONDS))
[ "$left" -lt 70 ] && { echo "no time left for the server (${left} s)"; exit 0; }
OUT=/tmp/sweep8 timeout -k 5 $((left + 3)) python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
    --methods ar,dflash,ddtree --concurrency 8 --budgets 32 --max-new-tokens 128 --min-requests 16 \
    --min-seconds 3 --max-requests 4000 --repeats 2 --time-budget-s "$((left - 3))" > /tmp/sweep8.log 2>&1
echo "sweep rc=$?"; cp /tmp/sweep8/sweep.txt "$OUT/sweep_8.txt" && head -12 "$OUT/sweep_8.txt"
true
